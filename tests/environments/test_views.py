"""The Environments pages: the list (empty state, create form, errors on the form), an
environment's page (status, the ssh command, the ~/.ssh/config entry, start and stop),
delete behind a confirmation that asks about the home volume, and the tenant scope."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.services.ssh_keys import ssh_key_add
from environments import selectors, services
from environments.models import Environment
from storage.models import Volume
from tests.conftest import signed_in_client
from tests.factories import ed25519_public_key_line
from tests.jobs_helpers import advance_to

LIST = reverse("environments:list")
FORM = {"name": "box", "region": "local", "image": "python-3.11", "interactive": "ssh",
        "cpus": "1", "gpu_type": "",
        "gpus_per_node": "0", "home_volume": "", "home_volume_gib": "10"}  # fmt: skip


@pytest.fixture
def member(world):
    return signed_in_client(world.member, world.tenant)


def test_list_is_empty_then_the_form_creates_one(world, catalog, member):
    page = member.get(LIST)
    assert page.status_code == 200
    assert b'data-testid="environments-empty"' in page.content
    assert b'href="/environments/"' in page.content  # the nav link
    response = member.post(LIST, FORM)
    assert response.status_code == 302
    assert response["Location"] == reverse("environments:detail", kwargs={"name": "box"})
    page = member.get(LIST)
    assert b'data-environment-row="box"' in page.content


def test_the_form_shows_refusals_beside_their_fields(world, catalog, member):
    member.post(LIST, FORM)
    again = member.post(LIST, FORM)
    assert again.status_code == 200
    assert "An environment named box exists already." in again.content.decode()
    bad = member.post(LIST, {**FORM, "name": "Bad Name"})
    assert "lower-case letters" in bad.content.decode()


def test_the_page_shows_how_to_connect_and_starts_and_stops(world, catalog, member):
    environment = services.environment_create(
        tenant=world.tenant, user=world.member, name="box", region="local",
        image="python-3.11", cpus=1,
    )  # fmt: skip
    page = member.get(reverse("environments:detail", kwargs={"name": "box"})).content.decode()
    assert selectors.ssh_command(environment) in page
    assert "ProxyJump box.acme@" in page
    assert selectors.host_key_fingerprint(environment) in page
    assert "You have no SSH key yet" in page

    start = reverse("environments:start", kwargs={"name": "box"})
    member.post(start)  # refused (no key): said on the page, nothing started
    assert Environment.objects.get().current_job is None
    ssh_key_add(user=world.member, public_key=ed25519_public_key_line())
    member.post(start)
    assert Environment.objects.get().status == "starting"
    member.post(reverse("environments:stop", kwargs={"name": "box"}))
    assert Environment.objects.get().status == "stopped"


def test_delete_asks_first_and_keeps_the_volume_unless_told(world, catalog, member):
    for name in ("box", "tmp"):
        services.environment_create(
            tenant=world.tenant, user=world.member, name=name, region="local",
            image="python-3.11", cpus=1,
        )  # fmt: skip
    url = reverse("environments:delete", kwargs={"name": "box"})
    asked = member.get(url)
    assert asked.status_code == 200
    assert "Its home volume box-home is kept" in asked.content.decode()
    assert "?keep_volume=false" in asked.content.decode()
    assert Environment.objects.filter(name="box").exists()
    assert member.post(url).status_code == 302
    assert not Environment.objects.filter(name="box").exists()
    assert Volume.objects.get(name="box-home").deleted_at is None

    url = reverse("environments:delete", kwargs={"name": "tmp"}) + "?keep_volume=false"
    assert "every file" in member.get(url).content.decode()
    member.post(url)
    assert Volume.objects.get(name="tmp-home").deleted_at is not None


def test_another_tenant_s_environment_is_a_404(world, other_world, catalog):
    services.environment_create(
        tenant=world.tenant, user=world.member, name="box", region="local",
        image="python-3.11", cpus=1,
    )  # fmt: skip
    theirs = signed_in_client(other_world.owner, other_world.tenant)
    for name in ("detail", "delete"):
        assert (
            theirs.get(reverse(f"environments:{name}", kwargs={"name": "box"})).status_code == 404
        )
    for name in ("start", "stop", "delete"):
        assert (
            theirs.post(reverse(f"environments:{name}", kwargs={"name": "box"})).status_code == 404
        )
    assert b"box" not in theirs.get(LIST).content


def test_the_status_refreshes_itself_while_the_environment_may_change(world, catalog, member):
    services.environment_create(
        tenant=world.tenant, user=world.member, name="box", region="local",
        image="python-3.11", cpus=1,
    )  # fmt: skip
    ssh_key_add(user=world.member, public_key=ed25519_public_key_line())
    detail = reverse("environments:detail", kwargs={"name": "box"})
    htmx = {"HX-Request": "true", "HX-Target": "environment-status"}
    stopped = member.get(detail, headers=htmx).content.decode()
    assert 'id="environment-status"' in stopped and "hx-get" not in stopped  # settled
    assert "Connect with SSH" not in stopped  # the partial only
    member.post(reverse("environments:start", kwargs={"name": "box"}))
    starting = member.get(detail, headers=htmx).content.decode()
    assert 'hx-trigger="every 5s"' in starting and ">Starting<" in starting
    assert ">Stop</button>" in starting


def test_a_jupyter_environment_s_page_offers_jupyter_to_its_creator_only(world, catalog, member):
    services.environment_create(
        tenant=world.tenant, user=world.member, name="lab", region="local",
        image="python-3.11", cpus=1, interactive="jupyter",
    )  # fmt: skip
    url = reverse("environments:detail", kwargs={"name": "lab"})
    page = member.get(url).content.decode()
    assert "Connect with SSH" not in page  # Jupyter only
    assert 'data-testid="jupyter-url"' in page and "/env/acme/lab/tree" in page
    member.post(reverse("environments:start", kwargs={"name": "lab"}))  # no key needed
    environment = Environment.objects.get(name="lab")
    assert environment.status == "starting"
    assert "Jupyter opens once it runs." in member.get(url).content.decode()
    advance_to(environment.current_job, "running")
    assert 'data-testid="open-jupyter"' in member.get(url).content.decode()

    admin_page = signed_in_client(world.admin, world.tenant).get(url).content.decode()
    assert 'data-testid="jupyter-creator-only"' in admin_page
    assert 'data-testid="open-jupyter"' not in admin_page
