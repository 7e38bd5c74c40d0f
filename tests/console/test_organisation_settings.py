"""The organisation settings page and API: every member reads the self-repair defaults,
owners and admins change them (audited with what changed), anyone else is refused."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.models import AuditEvent
from tests.conftest import signed_in_client, token_client

pytestmark = pytest.mark.django_db

URL = "/api/v1/organisation/settings"


def test_members_read_the_defaults_and_admins_change_them_over_the_api(world):
    member = token_client(world.member, world.tenant)
    assert member.get(URL).json() == {
        "slug": "acme",
        "name": "Acme Corp",
        "hardware_repair_default": True,
        "loss_explosion_pause_default": True,
    }
    refused = member.patch(URL, {"hardware_repair_default": False}, format="json")
    assert refused.status_code == 403, refused.content
    assert token_client(world.viewer, world.tenant).put(URL, {}, format="json").status_code == 403
    world.tenant.refresh_from_db()
    assert world.tenant.hardware_repair_default is True

    admin = token_client(world.admin, world.tenant)
    answer = admin.patch(URL, {"hardware_repair_default": False}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["hardware_repair_default"] is False
    assert answer.json()["loss_explosion_pause_default"] is True  # left out: unchanged
    event = AuditEvent.objects.get(action="tenant.self_repair_defaults_set")
    assert event.actor == world.admin and event.tenant == world.tenant
    assert event.metadata == {"hardware_repair_default": {"from": True, "to": False}}
    # The same again changes nothing and records nothing.
    admin.put(URL, {"hardware_repair_default": False}, format="json")
    assert AuditEvent.objects.filter(action="tenant.self_repair_defaults_set").count() == 1
    assert admin.patch(URL, {"hardware_repair_default": "no"}, format="json").status_code == 400


def test_each_organisation_sees_and_sets_only_its_own(world, other_world):
    theirs = token_client(other_world.owner, other_world.tenant)
    theirs.patch(URL, {"loss_explosion_pause_default": False}, format="json")
    ours = token_client(world.owner, world.tenant).get(URL).json()
    assert ours["slug"] == "acme" and ours["loss_explosion_pause_default"] is True


def test_the_page_shows_the_defaults_and_only_admins_save_them(world):
    url = reverse("organisation_settings")
    member = signed_in_client(world.member, world.tenant)
    page = member.get(url).content.decode()
    assert "Requeue a job on another node when its GPU reports a hardware fault" in page
    assert "Only the organisation's owners and admins can change these." in page
    assert "disabled" in page
    refused = member.post(url, {"loss_explosion_pause_default": "on"})
    assert refused.status_code == 403
    world.tenant.refresh_from_db()
    assert world.tenant.hardware_repair_default is True

    owner = signed_in_client(world.owner, world.tenant)
    # Unticked boxes are not sent: both off.
    saved = owner.post(url, {}, follow=True)
    assert "Organisation settings saved." in saved.content.decode()
    world.tenant.refresh_from_db()
    assert (world.tenant.hardware_repair_default, world.tenant.loss_explosion_pause_default) == (
        False,
        False,
    )
    event = AuditEvent.objects.get(action="tenant.self_repair_defaults_set")
    assert event.actor == world.owner
    assert event.metadata["loss_explosion_pause_default"] == {"from": True, "to": False}


def test_the_page_needs_a_sign_in(client, db):
    response = client.get(reverse("organisation_settings"))
    assert response.status_code == 302 and reverse("login") in response["Location"]
