"""What every signed-in page reads (its session, user, memberships and the bell's count,
compiled once per process) is read as Django would: expired sessions and deactivated
users sign out, the switcher lists active organisations, the bell counts one person's
unread notifications in the current organisation."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.sessions.models import Session
from django.urls import reverse
from django.utils import timezone

from console.models import Notification, Tenant, User
from tests.conftest import signed_in_client
from tests.factories import MembershipFactory, TenantFactory

pytestmark = pytest.mark.django_db


def bell_count(page) -> str | None:
    found = re.search(r'class="bell-count">(\d+)<', page.content.decode())
    return found[1] if found else None


def notify(tenant, user, *, read: bool = False) -> Notification:
    return Notification.objects.create(
        tenant=tenant, user=user, title="job ended", read_at=timezone.now() if read else None
    )


def test_the_bell_counts_the_user_s_unread_notifications_here(world, other_world):
    MembershipFactory(tenant=other_world.tenant, user=world.member)
    notify(world.tenant, world.member)
    notify(world.tenant, world.member)
    notify(world.tenant, world.member, read=True)
    notify(world.tenant, world.admin)  # someone else's
    notify(other_world.tenant, world.member)  # another organisation's
    page = signed_in_client(world.member, world.tenant)

    assert bell_count(page.get(reverse("jobs:list"))) == "2"
    Notification.objects.filter(user=world.member).update(read_at=timezone.now())
    assert bell_count(page.get(reverse("jobs:list"))) is None
    elsewhere = signed_in_client(world.member, other_world.tenant)
    notify(other_world.tenant, world.member)
    assert bell_count(elsewhere.get(reverse("jobs:list"))) == "1"


def test_an_expired_session_signs_out(world):
    page = signed_in_client(world.member, world.tenant)
    assert page.get(reverse("jobs:list")).status_code == 200
    Session.objects.update(expire_date=timezone.now() - timedelta(seconds=1))
    answer = page.get(reverse("jobs:list"))
    assert answer.status_code == 302 and reverse("login") in answer["Location"]


def test_a_deactivated_user_is_signed_out_on_the_next_page(world):
    page = signed_in_client(world.member, world.tenant)
    assert page.get(reverse("jobs:list")).status_code == 200
    User.objects.filter(pk=world.member.pk).update(is_active=False)
    answer = page.get(reverse("jobs:list"))
    assert answer.status_code == 302 and reverse("login") in answer["Location"]


def test_the_switcher_lists_the_user_s_active_organisations(world):
    closed = TenantFactory(name="Closed Corp", slug="closed")
    MembershipFactory(tenant=closed, user=world.member)
    second = TenantFactory(name="Second Corp", slug="second")
    MembershipFactory(tenant=second, user=world.member)
    Tenant.objects.filter(pk=closed.pk).update(is_active=False)

    page = signed_in_client(world.member, second).get(reverse("jobs:list"))

    assert page.status_code == 200
    assert [m.tenant.name for m in page.context["my_memberships"]] == [
        world.tenant.name,
        "Second Corp",
    ]
    assert page.context["current_tenant"] == second
