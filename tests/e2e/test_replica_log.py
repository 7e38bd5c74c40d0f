"""A service replica's log in the browser over the real stack (uvicorn, a sandboxed
replica process): the page opens the live socket and shows each new line once, in order,
without polling; when the replica stops the page says so."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from services import reconcile, services
from services.models import ReplicaState
from tests.e2e.test_live_job import sign_in
from tests.servers import wait_until
from tests.services.conftest import echo_spec, reconcile_until, replicas_cleanup  # noqa: F401
from tests.services.test_log_socket import TICKER, numbers

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("replicas_cleanup")]


def test_the_replica_log_is_live(browser_page, asgi_server, world, catalog, password):
    page, base = browser_page, asgi_server.url
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=echo_spec(name="ticker", command=TICKER, min_replicas=1, readiness_path="/"),
    )
    service = reconcile_until(
        service, lambda s: s.replicas.filter(state=ReplicaState.READY).exists()
    )
    replica = service.replicas.get(state=ReplicaState.READY)
    sign_in(page, base, world.member.email, password)
    page.goto(f"/services/{service.pk}/replicas/{replica.pk}/logs/")
    expect(page.locator("html")).to_have_attribute("data-replica-socket", "open")
    log = page.get_by_test_id("replica-log")

    def ticks() -> list[int]:
        return numbers(log.inner_text().splitlines())

    first = ticks()[-1]
    wait_until(lambda: ticks()[-1] >= first + 10, 20, what="ten new lines on the page")
    shown = ticks()
    assert shown == list(range(shown[0], shown[-1] + 1))  # each once, in order
    reconcile.replica_stop(replica, "scaled down")
    expect(page.get_by_test_id("replica-state")).to_have_text("Stopped", timeout=10_000)
    expect(page.locator("[data-replica-reason]")).to_contain_text("scaled down")
