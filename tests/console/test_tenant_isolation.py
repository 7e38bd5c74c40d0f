"""Generated walk over every URL pattern: sign-in is required, and a foreign tenant's
objects are 404 (never 403, never shown).

A new URL with an unknown keyword argument fails this test until FOREIGN_KWARGS says
which foreign object fills it, so no route escapes the walk.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from billing.budgets.services import budget_create
from billing.invoices.services import invoice_adjustment_add, invoice_draft_create
from console.services.audit import audit_record
from console.services.invitations import invitation_create
from console.services.ssh_keys import ssh_key_add
from console.services.tokens import api_token_create
from environments.services import environment_create
from jobs.backends.local import LocalBackend
from jobs.services import JobSpec, job_submit, launch_template_save, tenant_secret_set
from marketplace.demo import seed_catalog
from marketplace.models import AllowedRegistry, GpuType, NodePool, PriceVersion
from marketplace.services import (
    capacity_sync,
    image_create,
    node_mark_suspect,
    registry_credential_set,
)
from services.models import ServiceReplica
from services.services import ServiceSpec, service_create, service_token_create
from tests.conftest import signed_in_client, token_client
from tests.factories import VolumeFactory, ed25519_public_key_line

# URL names anyone may open without signing in.
PUBLIC = {
    "login",
    "logout",
    "signup",
    "signup_sent",
    "signup_verify",
    "password_reset",
    "password_reset_done",
    "password_reset_confirm",
    "password_reset_complete",
    "healthz",
    "readyz",
    # A bearer token (METRICS_TOKEN), not a session (tests/console/test_prometheus_metrics.py).
    "metrics",
    "invitation_accept",
    "api-auth-token",
    "api-schema",
    "api-swagger",
    "api-redoc",
    # Stripe's deliveries: no session; the body's signature is checked (tests/billing/).
    "billing:stripe_webhook",
    # A job's own checkpoint token, never a session or API token: any other credential,
    # another tenant's included, gets 404 (tests/jobs/test_checkpoint_events.py and
    # tests/jobs/test_checkpoint_credentials.py).
    "api-job-checkpoint-events",
    "api-job-checkpoint-credentials",
}
# Shared catalog data (not owned by a tenant): readable by every member, written by staff
# only. The walk still checks sign-in and that no foreign tenant data shows up.
SHARED_CATALOG = {
    "api-gpu-type-detail",
    "api-region-detail",
    "api-pool-detail",
    "api-price-version-detail",
    "api-staff-pool-detail",
}
# Django's own admin has its own staff sign-in; checked separately below.
SKIP_PREFIXES = ("django-admin/",)


def walk(patterns, prefix="", namespace=""):
    for entry in patterns:
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from walk(entry.url_patterns, prefix + str(entry.pattern), inner)
        elif isinstance(entry, URLPattern):
            route = prefix + str(entry.pattern)
            if route.startswith(SKIP_PREFIXES) or not entry.name:
                continue
            kwarg_names = tuple(sorted(entry.pattern.regex.groupindex))
            yield namespace + entry.name, route, kwarg_names


ALL_ROUTES = sorted(set(walk(get_resolver().url_patterns)), key=lambda r: r[0])
PRIVATE_ROUTES = [r for r in ALL_ROUTES if r[0] not in PUBLIC]
# (route, auth) pairs: every private route with a session, API routes also with a token.
ISOLATION_CASES = [(r, "session") for r in PRIVATE_ROUTES] + [
    (r, "token") for r in PRIVATE_ROUTES if r[1].startswith("api/")
]


@pytest.fixture
def foreign(other_world, world):
    """Objects of the other tenant (globex) that the acme user must never reach."""
    membership = other_world.membership(other_world.member)
    invitation, raw_invite = invitation_create(
        tenant=other_world.tenant,
        by_membership=other_world.membership(other_world.owner),
        email="secret-invitee@globex.test",
        role="member",
    )
    token, _ = api_token_create(
        user=other_world.owner, tenant=other_world.tenant, name="globex-secret-token"
    )
    audit_record(action="globex.secret_action", tenant=other_world.tenant, actor=other_world.owner)

    seed_catalog()
    private_image = image_create(
        tenant=other_world.tenant,
        slug="globex-secret-image",
        name="globex-secret-image",
        reference="ghcr.io/globex/secret:1.0",
        kind="framework",
        compatible_with=["nvidia"],
        user=other_world.owner,
    )

    capacity_sync(backend=LocalBackend())
    foreign_job = job_submit(
        tenant=other_world.tenant,
        user=other_world.owner,
        spec=JobSpec(name="globex-secret-job", image="python-3.11", command=["true"], cpus=1),
    )

    foreign_volume = VolumeFactory(tenant=other_world.tenant, name="globex-data")
    foreign_environment = environment_create(
        tenant=other_world.tenant,
        user=other_world.owner,
        name="globex-box",
        region=foreign_volume.region.slug,
        image="python-3.11",
        cpus=1,
        home_volume=foreign_volume.name,
        interactive="both",  # its Jupyter route too is walked
    )

    foreign_secret = tenant_secret_set(
        tenant=other_world.tenant,
        user=other_world.owner,
        name="GLOBEX_SECRET_NAME",
        value="globex-secret-value",
    )

    foreign_template = launch_template_save(
        job=foreign_job, name="globex-secret-template", user=other_world.owner
    )

    foreign_budget = budget_create(
        tenant=other_world.tenant, user=other_world.owner, name="globex-secret-budget", amount="100"
    )

    foreign_invoice = invoice_draft_create(
        tenant=other_world.tenant,
        period_start=datetime(2026, 11, 1, tzinfo=UTC),
        period_end=datetime(2026, 12, 1, tzinfo=UTC),
    )
    invoice_adjustment_add(
        invoice=foreign_invoice,
        description="globex-secret-invoice-line",
        amount=Decimal(1),
        reason="setup",
        user=None,
    )

    foreign_registry_login = registry_credential_set(
        tenant=other_world.tenant,
        user=other_world.owner,
        registry=AllowedRegistry.objects.first().host,
        username="globex-secret-robot",
        password="globex-registry-password",
    )
    foreign_ssh_key = ssh_key_add(
        user=other_world.owner,
        public_key=ed25519_public_key_line("globex@laptop"),
        title="globex-secret-ssh-key",
    )
    foreign_service = service_create(
        tenant=other_world.tenant,
        user=other_world.owner,
        spec=ServiceSpec(
            name="globex-secret-service", image="python:3.11", command=["true"], port=8080,
            region="local",
        ),
    )  # fmt: skip
    foreign_service_token, _ = service_token_create(
        service=foreign_service, user=other_world.owner, name="globex-secret-service-token"
    )
    # A replica row as a reconcile pass writes it (no process: the logs must 404, not run).
    foreign_replica = ServiceReplica.objects.create(
        service=foreign_service,
        revision=foreign_service.revisions.get(number=1),
        handle="globex-secret-replica",
    )
    pool = NodePool.objects.first()
    version = PriceVersion.objects.first()
    suspect = node_mark_suspect(name=f"{pool.slug}-9", pool=pool, reason="XID 79")
    by_basename = {
        "api-ssh-key": foreign_ssh_key.pk,
        "api-registry-credential": foreign_registry_login.pk,
        "api-member": membership.pk,
        "api-invitation": invitation.pk,
        "api-token": token.pk,
        "api-image": private_image.pk,
        "api-pool": pool.pk,
        "api-staff-pool": pool.pk,
        "api-job": foreign_job.pk,
        "api-budget": foreign_budget.pk,
        "api-invoice": foreign_invoice.pk,
        "api-price-version": version.pk,
        "api-secret": foreign_secret.pk,
        "api-volume": foreign_volume.pk,
        "api-service": foreign_service.pk,
    }
    return {
        "kwargs": {
            "membership_id": membership.pk,
            "invitation_id": invitation.pk,
            "token_id": token.pk,
            "tenant_slug": other_world.tenant.slug,
            "token": raw_invite,
            "job_id": foreign_job.pk,
            "secret_id": foreign_secret.pk,
            "volume_id": foreign_volume.pk,
            "service_id": foreign_service.pk,
            "service_token_id": foreign_service_token.pk,
            "replica_id": foreign_replica.pk,
            "name": foreign_environment.name,  # environments are addressed by name
            "path": "tree",  # a page of an environment's Jupyter (environments.proxy)
            "revision_number": 1,
            "template_id": foreign_template.pk,
            "budget_id": foreign_budget.pk,
            "invoice_id": foreign_invoice.pk,
            "action": "pause",
            "image_id": private_image.pk,  # also staff_image_retire: staff-only, 404
            "credential_id": foreign_registry_login.pk,
            "key_id": foreign_ssh_key.pk,
            # staff-only pages: a tenant owner must get 404 whatever the object
            "version_id": version.pk,
            "pool_id": pool.pk,
            "gpu_type_slug": GpuType.objects.first().slug,
            "registry_id": AllowedRegistry.objects.first().pk,
            "slug": GpuType.objects.first().slug,
            # the sandbox's chaos controls: staff-only, 404 for a tenant owner
            "pool_slug": pool.slug,
            "node": f"{pool.slug}-0",
            "node_id": suspect.pk,  # a suspect node: staff-only, 404 for a tenant owner
        },
        "pk_by_basename": by_basename,
        # Strings that would only appear if foreign data leaked into a page or response.
        "markers": [
            "secret-invitee@globex.test",
            "globex-secret-token",
            "globex.secret_action",
            other_world.member.email,
            "globex-secret-image",
            "globex-secret-job",
            "GLOBEX_SECRET_NAME",
            "globex-secret-template",
            "globex-secret-budget",
            "globex-secret-invoice-line",
            "globex-secret-value",
            "globex-secret-robot",
            "globex-registry-password",
            "globex-secret-ssh-key",
            foreign_ssh_key.fingerprint,
            "globex-secret-service",
        ],
    }


def url_for(name, kwarg_names, foreign):
    kwargs = {}
    for kwarg in kwarg_names:
        if kwarg == "pk":
            # The router basename is the longest mapped prefix of the URL name.
            basenames = [b for b in foreign["pk_by_basename"] if name.startswith(b + "-")]
            assert basenames, f"map `pk` of {name} to a model"
            kwargs["pk"] = foreign["pk_by_basename"][max(basenames, key=len)]
        else:
            assert kwarg in foreign["kwargs"], (
                f"URL {name} has kwarg {kwarg!r}: add a foreign object for it to this test"
            )
            kwargs[kwarg] = foreign["kwargs"][kwarg]
    return reverse(name, kwargs=kwargs) if kwargs else reverse(name)


def test_public_urls_are_only_the_known_ones():
    assert {name for name, _, _ in ALL_ROUTES} >= PUBLIC


def test_walk_covers_the_console():
    names = {name for name, _, _ in ALL_ROUTES}
    assert {
        "dashboard",
        "members",
        "api_tokens",
        "audit_log",
        "api-token-list",
        "api-token-detail",
        "api-member-detail",
    } <= names


@pytest.mark.parametrize(
    ("name", "route", "kwarg_names"), PRIVATE_ROUTES, ids=[r[0] for r in PRIVATE_ROUTES]
)
def test_every_private_url_requires_sign_in(client, foreign, name, route, kwarg_names):
    url = url_for(name, kwarg_names, foreign)
    for method in ("get", "post"):
        response = getattr(client, method)(url)
        if url.startswith("/api/"):
            assert response.status_code in (401, 403, 405), (method, url, response.status_code)
            if response.status_code != 405:
                assert "detail" in response.json()
        else:
            assert response.status_code in (302, 405), (method, url, response.status_code)
            if response.status_code == 302:
                assert response["Location"].startswith(reverse("login")), response["Location"]


@pytest.mark.parametrize(
    ("route_info", "auth"), ISOLATION_CASES, ids=[f"{auth}-{r[0]}" for r, auth in ISOLATION_CASES]
)
def test_foreign_tenant_objects_are_404_or_absent(world, foreign, route_info, auth):
    name, _route, kwarg_names = route_info
    # The owner has every capability, so a 404 here is isolation, not a role refusal.
    client = (
        signed_in_client(world.owner, world.tenant)
        if auth == "session"
        else token_client(world.owner, world.tenant)
    )
    url = url_for(name, kwarg_names, foreign)
    methods = ("get", "post", "patch", "delete") if kwarg_names else ("get",)
    for method in methods:
        response = getattr(client, method)(url)
        body = response.content.decode(errors="replace")
        if name in SHARED_CATALOG:
            assert response.status_code in (200, 403, 404, 405), (method, url, response.status_code)
        elif kwarg_names:
            assert response.status_code in (404, 405), (method, url, response.status_code)
        else:
            assert response.status_code in (200, 302, 404, 405), (method, url, response.status_code)
        for marker in foreign["markers"]:
            assert marker not in body, f"{marker} leaked through {method.upper()} {url}"
        if response.status_code == 404 and url.startswith("/api/"):
            assert response.json()["detail"]


def test_staff_pages_are_404_for_non_staff(world):
    client = signed_in_client(world.owner, world.tenant)
    assert client.get(reverse("staff_tenants")).status_code == 404
    assert client.get("/django-admin/").status_code == 302  # Django admin: staff sign-in


def test_tenant_switch_to_a_foreign_tenant_is_404(world, other_world):
    client = signed_in_client(world.owner, world.tenant)
    response = client.post(reverse("tenant_switch"), {"tenant": other_world.tenant.slug})
    assert response.status_code == 404
    # and the session still points at the user's own tenant
    assert world.tenant.name in client.get(reverse("dashboard")).content.decode()


def test_session_pointing_at_foreign_tenant_falls_back_to_own(world, other_world):
    client = signed_in_client(world.owner, other_world.tenant)
    page = client.get(reverse("dashboard")).content.decode()
    assert world.tenant.name in page
    assert other_world.tenant.name not in page


def test_routes_use_explicit_kwarg_names():
    """`pk` is only allowed in router routes whose basename maps to a model above."""
    for name, route, kwarg_names in ALL_ROUTES:
        if "pk" in kwarg_names:
            assert re.match(r"api-[a-z]+-", name), name
