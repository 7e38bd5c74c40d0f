"""services.selectors.agateway_access, the gateway's lookup on the event loop, answers as
gateway_access does (one rule for both), reads nothing kept in the process beyond what
that does (a revoked token is refused from its commit on), and hands nothing to a worker
thread while the cache decides."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import SyncToAsync, async_to_sync

from services import selectors, services
from tests.services.conftest import echo_spec

pytestmark = pytest.mark.django_db(transaction=True)  # forgets run on commit


@pytest.fixture
def offered(world, other_world, catalog):
    """acme's token service `echo` (and a token for it) and public service `open`;
    globex's public service `theirs`."""
    echo = services.service_create(tenant=world.tenant, user=None, spec=echo_spec())
    _, raw = services.service_token_create(service=echo, user=None, name="t")
    public = services.service_create(
        tenant=world.tenant, user=None, spec=echo_spec(name="open", auth="public")
    )
    theirs = services.service_create(
        tenant=other_world.tenant, user=None, spec=echo_spec(name="theirs", auth="public")
    )
    return {"echo": echo, "open": public, "theirs": theirs, "raw": raw}


def answered(tenant_slug: str, name: str, token: str, *, sync_first: bool):
    """The one answer both lookups give, each asked twice: once reading the database
    (the first to ask) and once from the cache."""
    ask = {"tenant_slug": tenant_slug, "name": name, "token": token}
    answers = []
    for on_the_loop in (not sync_first, sync_first) * 2:
        if on_the_loop:
            answers.append(async_to_sync(selectors.agateway_access)(**ask))
        else:
            answers.append(selectors.gateway_access(**ask))
    assert all(answer == answers[0] for answer in answers), answers
    route, allowed = answers[0]
    return (route.service_id if route else None), allowed


@pytest.mark.parametrize("sync_first", [False, True], ids=["async-first", "sync-first"])
def test_both_lookups_give_the_same_answers(offered, sync_first):
    echo, public, raw = offered["echo"].pk, offered["open"].pk, offered["raw"]
    cases = [
        (("acme", "nothing", raw), (None, False)),  # an unknown service
        (("acme", "open", ""), (public, True)),
        (("acme", "open", "ggs_anything"), (public, True)),
        (("acme", "echo", ""), (echo, False)),  # no token
        (("acme", "echo", "ggs_wrong"), (echo, False)),
        (("acme", "echo", raw.removeprefix("ggs_")), (echo, False)),  # not a service token
        (("acme", "echo", raw), (echo, True)),
        (("acme", "theirs", ""), (None, False)),  # another organisation's service
        (("globex", "echo", raw), (None, False)),
    ]
    for (tenant_slug, name, token), expected in cases:
        assert answered(tenant_slug, name, token, sync_first=sync_first) == expected, name


@pytest.mark.parametrize("sync_first", [False, True], ids=["async-first", "sync-first"])
def test_a_revoked_token_is_refused_from_the_commit_on(offered, sync_first):
    raw = offered["raw"]
    assert answered("acme", "echo", raw, sync_first=sync_first)[1] is True  # (now kept)
    for token in offered["echo"].tokens.all():
        services.service_token_revoke(token=token, user=None)
    assert answered("acme", "echo", raw, sync_first=sync_first)[1] is False


class CountingExecutor(ThreadPoolExecutor):
    """A worker thread that counts what it is handed."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.handed = 0

    def submit(self, *args, **kwargs):
        self.handed += 1
        return super().submit(*args, **kwargs)


@pytest.fixture
def on_a_loop(monkeypatch):
    """Run a lookup on a fresh event loop whose worker threads (its default executor,
    where thread_sensitive=False work goes, and asgiref's one shared thread) count what
    they are handed: (the answer, how many hand-offs)."""

    def run(tenant_slug: str, name: str, token: str):
        executor = CountingExecutor()
        monkeypatch.setattr(SyncToAsync, "single_thread_executor", executor)
        loop = asyncio.new_event_loop()
        loop.set_default_executor(executor)
        try:
            ask = selectors.agateway_access(tenant_slug=tenant_slug, name=name, token=token)
            return loop.run_until_complete(ask), executor.handed
        finally:
            loop.close()
            executor.shutdown()

    return run


def test_when_the_cache_decides_no_thread_is_used(offered, on_a_loop):
    echo, public, raw = offered["echo"].pk, offered["open"].pk, offered["raw"]
    (route, allowed), hand_offs = on_a_loop("acme", "echo", raw)
    assert (route.service_id, allowed, hand_offs) == (echo, True, 1)  # read, then kept
    assert on_a_loop("acme", "echo", raw) == ((route, True), 0)
    assert on_a_loop("acme", "echo", "") == ((route, False), 0)
    on_a_loop("acme", "open", "")
    (route, allowed), hand_offs = on_a_loop("acme", "open", "")
    assert (route.service_id, allowed, hand_offs) == (public, True, 0)
    # A refusal is never kept: a wrong token is checked in the database, in a thread.
    assert on_a_loop("acme", "echo", "ggs_wrong")[1] == 1
