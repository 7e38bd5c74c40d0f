"""What every signed-in page reads (its session and user from the database, its
memberships and the bell's count kept in the cache) is read as Django would: expired
sessions and deactivated users sign out, the switcher lists active organisations, the
bell counts one person's unread notifications in the current organisation, and a change
to any of them shows on the next page."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.sessions.models import Session
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from console.models import Notification, Tenant, User
from console.services.notifications import notifications_mark_read
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
    notifications_mark_read(user=world.member, tenant=world.tenant)
    assert bell_count(page.get(reverse("jobs:list"))) is None
    notify(world.tenant, world.member)
    assert bell_count(page.get(reverse("jobs:list"))) == "1"
    elsewhere = signed_in_client(world.member, other_world.tenant)
    notify(other_world.tenant, world.member)
    assert bell_count(elsewhere.get(reverse("jobs:list"))) == "2"  # unread there: both


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


def test_a_page_reads_memberships_and_the_bell_from_the_cache(world):
    page = signed_in_client(world.member, world.tenant)
    page.get(reverse("jobs:list"))
    with CaptureQueriesContext(connection) as queries:
        assert page.get(reverse("jobs:list")).status_code == 200
    tables = " ".join(q["sql"] for q in queries)
    assert "console_membership" not in tables and "console_notification" not in tables


def test_a_new_membership_shows_in_the_switcher_on_the_next_page(world):
    page = signed_in_client(world.member, world.tenant)
    assert len(page.get(reverse("jobs:list")).context["my_memberships"]) == 1
    MembershipFactory(tenant=TenantFactory(name="Second Corp", slug="second"), user=world.member)
    assert len(page.get(reverse("jobs:list")).context["my_memberships"]) == 2
