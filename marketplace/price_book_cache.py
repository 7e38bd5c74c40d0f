"""The price book as offers read it, kept in memory by each process (the writes are in
`marketplace.services.price_book`).

A version in force can't change (marketplace.services refuses), so the version in force,
the next one and their entries, with GPU types and regions, are read once and reused
while the catalog revision is the same and the next version hasn't taken effect. The
revision is one row whose token changes in the same transaction as any change to what
offers show: checking it is one indexed read instead of three queries and ~150 model
instances a request."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models.signals import pre_delete, pre_save
from django.utils import timezone

from marketplace.models import CatalogRevision, GpuType, PriceEntry, PriceVersion, Region
from marketplace.pricing import UnitPrices, unit_prices

# Also bounds how long a change that sent no signal (raw SQL) could go unseen.
MAX_AGE = timedelta(minutes=5)
REVISION_ROW = 1
CATALOG_MODELS = (PriceVersion, PriceEntry, GpuType, Region)


@dataclass(frozen=True)
class PricedEntry:
    entry: PriceEntry  # with its GPU type and region
    prices: UnitPrices
    # The next version's prices for the same GPU type and region, when it sells them in
    # the same currency.
    next_prices: UnitPrices | None


@dataclass(frozen=True)
class PriceBook:
    version: PriceVersion
    upcoming: PriceVersion | None
    entries: tuple[PricedEntry, ...]  # active GPU types (or CPU) in active regions
    revision: str | None
    valid_until: datetime
    # Every entry's prices by (GPU type id or None, region id), a withdrawn GPU type's or
    # region's too: what jobs still running on them cost.
    prices_by_offer: dict[tuple[int | None, int], UnitPrices]


@dataclass(frozen=True)
class CatalogNames:
    """Every GPU type's and region's slug and display name by id, withdrawn ones too:
    what job lists show of them, without joining both tables into each page's query
    (those two joins were 5 of a list query's 6 ms of planning on PostgreSQL)."""

    gpu_types: dict[int, tuple[str, str]]  # id: (slug, model)
    regions: dict[int, tuple[str, str]]  # id: (slug, name)
    revision: str | None
    valid_until: datetime


_kept: dict[str, PriceBook] = {}
_names: dict[str, CatalogNames] = {}


def price_book(at: datetime | None = None) -> PriceBook | None:
    """The price book in force at `at` (now by default), None before the first version.
    Now's is kept in memory while it is current."""
    if at is not None:
        return _load(at, revision=None)
    now = timezone.now()
    revision = catalog_revision()
    kept = _kept.get("now")
    if kept and revision and kept.revision == revision and now < kept.valid_until:
        return kept
    book = _load(now, revision)
    if book is not None and revision:
        _kept["now"] = book
    return book


def catalog_names(
    *, gpu_type_ids: Iterable[int | None] = (), region_ids: Iterable[int | None] = ()
) -> CatalogNames:
    """GPU types' and regions' names, kept in memory while the catalog revision is the
    same (at most MAX_AGE), and read again when one of the ids asked for is missing (a
    row written without signals, e.g. by bulk_create)."""
    now = timezone.now()
    revision = catalog_revision()
    kept = _names.get("now")
    if (
        kept
        and revision
        and kept.revision == revision
        and now < kept.valid_until
        and all(pk is None or pk in kept.gpu_types for pk in gpu_type_ids)
        and all(pk is None or pk in kept.regions for pk in region_ids)
    ):
        return kept
    gpu_types = GpuType.objects.values_list("pk", "slug", "model")
    regions = Region.objects.values_list("pk", "slug", "name")
    names = CatalogNames(
        gpu_types={pk: (slug, model) for pk, slug, model in gpu_types},
        regions={pk: (slug, name) for pk, slug, name in regions},
        revision=revision,
        valid_until=now + MAX_AGE,
    )
    if revision:
        _names["now"] = names
    return names


def upcoming_price_version(version: PriceVersion) -> PriceVersion | None:
    """The price version published to take effect after `version` (the next one only)."""
    return (
        PriceVersion.objects.filter(effective_from__gt=version.effective_from)
        .order_by("effective_from", "pk")
        .first()
    )


def catalog_revision() -> str | None:
    """The catalog's current revision token (None when its row is missing: nothing is
    kept then). Plain SQL: this runs on every offers request."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT token FROM {CatalogRevision._meta.db_table} WHERE id = %s",  # noqa: S608
            [REVISION_ROW],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def catalog_changed(**_signal) -> None:
    """Before any save or delete of a catalog row: a new revision token, written in the
    same transaction (before the change, so catalog writers queue on this one row rather
    than deadlock on each other's)."""
    token = secrets.token_hex(16)
    if not CatalogRevision.objects.filter(pk=REVISION_ROW).update(token=token):
        CatalogRevision.objects.update_or_create(pk=REVISION_ROW, defaults={"token": token})
    _kept.clear()
    _names.clear()


def connect_signals() -> None:
    for model in CATALOG_MODELS:
        pre_save.connect(catalog_changed, sender=model, dispatch_uid=f"catalog-{model.__name__}")
        pre_delete.connect(
            catalog_changed, sender=model, dispatch_uid=f"catalog-del-{model.__name__}"
        )


def _load(at: datetime, revision: str | None) -> PriceBook | None:
    version = PriceVersion.objects.in_force(at)
    if version is None:
        return None
    upcoming = upcoming_price_version(version)
    following = {}
    if upcoming is not None and upcoming.currency == version.currency:
        following = {(e.gpu_type_id, e.region_id): e for e in upcoming.entries.all()}
    priced, prices_by_offer = [], {}
    for entry in version.entries.select_related("gpu_type", "region"):
        prices = unit_prices(entry, version)
        prices_by_offer[(entry.gpu_type_id, entry.region_id)] = prices
        if not entry.region.is_active or (entry.gpu_type and not entry.gpu_type.is_active):
            continue  # not offered
        following_entry = following.get((entry.gpu_type_id, entry.region_id))
        priced.append(
            PricedEntry(
                entry=entry,
                prices=prices,
                next_prices=(
                    unit_prices(following_entry, upcoming) if following_entry and upcoming else None
                ),
            )
        )
    valid_until = at + MAX_AGE
    if upcoming is not None:
        valid_until = min(valid_until, upcoming.effective_from)
    return PriceBook(version, upcoming, tuple(priced), revision, valid_until, prices_by_offer)
