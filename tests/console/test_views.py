"""Browser pages of the console shell: sign-in and its throttling, sign-up, members and
invitations, tokens, audit, tenant switching, staff pages, /healthz and seed_demo."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console import heartbeats
from console.models import (
    ApiToken,
    AuditEvent,
    Heartbeat,
    Invitation,
    Membership,
    Tenant,
    User,
)
from console.permissions import Role
from console.services.invitations import invitation_accept, invitation_create, invitation_revoke
from console.services.tokens import api_token_authenticate, api_token_create
from tests.conftest import signed_in_client
from tests.factories import JobFactory, MembershipFactory, NodePoolFactory, UserFactory

LOGIN = reverse("login")
STRONG_PASSWORD = "a-long-unusual-passphrase-17"
LOCKOUT_MESSAGE = "Too many failed sign-in attempts"
HTMX = {"HTTP_HX_REQUEST": "true"}


def sign_in(client: Client, email: str, password: str, ip: str = "127.0.0.1"):
    return client.post(LOGIN, {"username": email, "password": password}, REMOTE_ADDR=ip)


def page(response) -> str:
    return response.content.decode()


def accept_path(raw: str) -> str:
    return reverse("invitation_accept", args=[raw])


# --- sign-in ----


def test_anonymous_dashboard_redirects_to_login(client, db):
    response = client.get("/")

    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/"


def test_sign_in_by_email_is_case_insensitive_and_audited_with_ip(world, client, password):
    response = sign_in(client, "  MEMBER@Acme.TEST", password, ip="198.51.100.20")

    assert response.status_code == 302
    assert response["Location"] == reverse("dashboard")
    assert client.get("/").wsgi_request.user == world.member
    event = AuditEvent.objects.get(action="auth.signed_in")
    assert (event.actor, event.ip_address, event.tenant) == (world.member, "198.51.100.20", None)


def test_wrong_password_shows_a_form_error(world, client):
    response = sign_in(client, world.member.email, "not-the-password", ip="198.51.100.21")

    assert response.status_code == 200
    assert "E-mail or password is wrong" in page(response)
    assert not response.wsgi_request.user.is_authenticated
    failed = AuditEvent.objects.get(action="auth.sign_in_failed")
    assert (failed.actor_label, failed.ip_address) == (world.member.email, "198.51.100.21")


def test_sixth_attempt_after_five_failures_is_429_with_a_message(world, client):
    statuses = [sign_in(client, world.member.email, "wrong").status_code for _ in range(5)]
    sixth = sign_in(client, world.member.email, "wrong")

    assert statuses[:4] == [200] * 4
    assert sixth.status_code == 429
    assert LOCKOUT_MESSAGE in page(sixth)
    assert "15 minutes" in page(sixth)
    assert 'name="username"' in page(sixth)  # still the sign-in page, not an error page


def test_lockout_spares_the_same_account_elsewhere_and_other_accounts_here(world, client, password):
    for _ in range(5):
        sign_in(client, world.member.email, "wrong", ip="192.0.2.1")

    other_ip = sign_in(Client(), world.member.email, password, ip="192.0.2.99")
    other_account = sign_in(Client(), world.viewer.email, password, ip="192.0.2.1")

    assert other_ip.status_code == 302
    assert other_account.status_code == 302


def test_lockout_is_per_account_and_ip(world, client, password):
    """Regression: without AXES_USERNAME_FORM_FIELD axes looked for an `email` credential
    and recorded username=None: the right password still signed in and everyone's
    failures from one IP shared one counter."""
    for _ in range(5):
        sign_in(client, world.member.email, "wrong", ip="192.0.2.1")

    locked = sign_in(Client(), world.member.email, password, ip="192.0.2.1")
    neighbour_typo = sign_in(Client(), world.viewer.email, "typo", ip="192.0.2.1")

    assert locked.status_code == 429
    assert not locked.wsgi_request.user.is_authenticated
    assert neighbour_typo.status_code == 200  # a form error, not someone else's lockout


def test_lockout_counts_case_variants_of_one_email_together(world, client, password):
    """Sign-in is case-insensitive, so changing the e-mail's case must not buy more guesses."""
    for variant in ["member@acme.test", "Member@acme.test", "MEMBER@acme.test"] * 2:
        sign_in(client, variant, "wrong")

    response = sign_in(Client(), "mEmBeR@acme.test", password)

    assert response.status_code == 429


# --- sign-up and dashboard ----


def test_signup_verifies_the_address_then_lands_on_dashboard(
    client, db, worker_outbox, django_capture_on_commit_callbacks
):
    form = {
        "full_name": "Grace H.",
        "email": "Grace@Example.test",
        "organisation_name": "Compilers Inc",
        "password1": STRONG_PASSWORD,
        "password2": STRONG_PASSWORD,
    }

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("signup"), form, REMOTE_ADDR="198.51.100.30", follow=True)

    assert response.redirect_chain == [(reverse("signup_sent"), 302)]
    assert "Check your e-mail" in page(response)
    assert not response.wsgi_request.user.is_authenticated
    user = User.objects.get(email="grace@example.test")
    assert not user.is_active  # until the address is verified
    assert AuditEvent.objects.get(action="user.signed_up").ip_address == "198.51.100.30"

    # The link in the e-mail the worker sends, with the password chosen at sign-up,
    # activates the account and signs in.
    (message,) = worker_outbox
    link = re.search(r"http://testserver(/accounts/verify/[\w-]+/[\w-]+/)", message.body)
    verified = client.post(link.group(1), {"password": STRONG_PASSWORD}, follow=True)

    assert verified.redirect_chain == [(reverse("dashboard"), 302)]
    assert "Compilers Inc" in page(verified)
    assert verified.wsgi_request.user == user
    assert verified.wsgi_request.tenant.name == "Compilers Inc"


def test_signup_form_errors_are_shown_not_raised(client, db):
    UserFactory(email="taken@example.test")
    base = {"organisation_name": "X", "password1": STRONG_PASSWORD, "password2": STRONG_PASSWORD}

    taken = client.post(reverse("signup"), {**base, "email": "TAKEN@example.test"})
    weak = client.post(
        reverse("signup"),
        {**base, "email": "weak@example.test", "password1": "123", "password2": "123"},
    )
    mismatch = client.post(
        reverse("signup"), {**base, "email": "mm@example.test", "password2": "different-one-99"}
    )

    # A known address is not an error: it gets the "check your e-mail" answer of any other
    # (its owner is e-mailed), so the page never tells who has an account.
    assert taken.status_code == 302
    assert taken["Location"] == reverse("signup_sent")
    assert weak.status_code == mismatch.status_code == 200
    assert "too short" in page(weak)
    assert "The two passwords differ" in page(mismatch)
    assert not User.objects.filter(email__in=["weak@example.test", "mm@example.test"]).exists()


def test_dashboard_empty_state(owner_client, world):
    response = owner_client.get("/")

    assert response.status_code == 200
    body = page(response)
    assert world.tenant.name in body
    assert "No jobs yet" in body
    assert "Nothing has happened here yet" in body  # owners see the activity card


def test_dashboard_without_any_tenant_sends_to_tenant_creation(db):
    client = signed_in_client(UserFactory())

    response = client.get("/")

    assert response.status_code == 302
    assert response["Location"] == reverse("tenant_create")


def test_tenant_pages_without_any_tenant_send_to_tenant_creation(db):
    """Regression: capability_required answered 403 "your role does not allow this"."""
    client = signed_in_client(UserFactory())

    response = client.get(reverse("api_tokens"))

    assert response.status_code == 302
    assert response["Location"] == reverse("tenant_create")


def test_tenant_create_page_makes_the_user_owner(db):
    user = UserFactory()
    client = signed_in_client(user)

    response = client.post(reverse("tenant_create"), {"name": "Fresh Org"})

    assert response.status_code == 302
    tenant = Tenant.objects.get(name="Fresh Org")
    assert Membership.objects.get(tenant=tenant, user=user).role == Role.OWNER
    assert client.get("/").wsgi_request.tenant == tenant


# --- members and invitations ----


def test_owner_sees_the_invite_form_member_does_not(world, owner_client):
    owner_page = page(owner_client.get(reverse("members")))
    member_page = page(signed_in_client(world.member, world.tenant).get(reverse("members")))

    assert "Invite someone" in owner_page
    assert "Invite someone" not in member_page
    assert world.viewer.email in member_page  # everyone sees who is in the team


def test_viewer_cannot_manage_members(world):
    client = signed_in_client(world.viewer, world.tenant)
    member = world.membership(world.member)

    body = page(client.get(reverse("members")))
    posted = client.post(reverse("members"), {"email": "x@example.test", "role": "member"})
    role = client.post(reverse("member_role", args=[member.pk]), {"role": "admin"})
    remove = client.get(reverse("member_remove", args=[member.pk]))

    assert "Invite someone" not in body
    assert f'action="{reverse("member_role", args=[member.pk])}"' not in body
    assert "Invitations" not in body
    assert posted.status_code == 404
    assert role.status_code == 403
    assert remove.status_code == 404
    assert not Invitation.objects.exists()
    assert world.membership(world.member).role == Role.MEMBER


def test_posting_an_invitation_shows_the_link_once_and_queues_mail_on_commit(
    world, owner_client, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = owner_client.post(
            reverse("members"), {"email": "invitee@example.test", "role": "viewer"}
        )

    assert response.status_code == 200
    assert len(callbacks) == 1  # the e-mail task, queued only once the invitation is committed
    link = re.search(r"http://testserver/invitations/accept/([\w-]+)/", page(response))
    assert link is not None
    invitation = Invitation.objects.get(email="invitee@example.test")
    assert invitation.role == Role.VIEWER
    again = page(owner_client.get(reverse("members")))
    assert "invitee@example.test" in again
    assert link.group(1) not in again


def test_invitation_form_errors_are_shown(world, owner_client):
    response = owner_client.post(
        reverse("members"), {"email": world.member.email, "role": "member"}
    )

    assert response.status_code == 200
    assert "already a member" in page(response)


def test_members_htmx_post_renders_only_the_partial(world, owner_client):
    response = owner_client.post(
        reverse("members"), {"email": "htmx@example.test", "role": "member"}, **HTMX
    )

    body = page(response)
    assert 'id="member-area"' in body
    assert "<html" not in body
    assert "/invitations/accept/" in body


def test_owner_changes_a_role_by_post(world, owner_client):
    membership = world.membership(world.member)

    response = owner_client.post(reverse("member_role", args=[membership.pk]), {"role": "admin"})

    assert response.status_code == 302
    assert response["Location"] == reverse("members")
    assert world.membership(world.member).role == Role.ADMIN


def test_role_change_refusal_is_a_message(world):
    client = signed_in_client(world.admin, world.tenant)

    response = client.post(
        reverse("member_role", args=[world.membership(world.owner).pk]),
        {"role": "member"},
        follow=True,
    )

    assert "Only an owner can change" in page(response)
    assert world.membership(world.owner).role == Role.OWNER


def test_role_change_needs_post(world, owner_client):
    response = owner_client.get(reverse("member_role", args=[world.membership(world.member).pk]))
    assert response.status_code == 405


def test_remove_asks_for_confirmation_then_removes_on_post(world, owner_client):
    membership = world.membership(world.member)
    url = reverse("member_remove", args=[membership.pk])

    confirm = owner_client.get(url)
    assert confirm.status_code == 200
    assert "Remove member" in page(confirm)
    assert world.member.email in page(confirm)
    assert Membership.objects.filter(pk=membership.pk).exists()

    removed = owner_client.post(url)
    assert removed.status_code == 302
    assert removed["Location"] == reverse("members")
    assert not Membership.objects.filter(pk=membership.pk).exists()


def test_member_leaves_an_organisation(world):
    client = signed_in_client(world.member, world.tenant)
    url = reverse("member_remove", args=[world.membership(world.member).pk])

    assert "Leave organisation" in page(client.get(url))
    response = client.post(url)

    assert response.status_code == 302
    assert response["Location"] == reverse("dashboard")
    assert not Membership.objects.filter(tenant=world.tenant, user=world.member).exists()
    assert client.get("/")["Location"] == reverse("tenant_create")


def test_invitation_revoke_by_post(world, owner_client):
    invitation, _ = invitation_create(
        tenant=world.tenant,
        by_membership=world.membership(world.owner),
        email="revoke-me@example.test",
        role="member",
    )

    response = owner_client.post(reverse("invitation_revoke", args=[invitation.pk]))

    assert response.status_code == 302
    invitation.refresh_from_db()
    assert invitation.state == "revoked"


# --- accepting an invitation ----


def invite(world, email, role=Role.MEMBER):
    return invitation_create(
        tenant=world.tenant, by_membership=world.membership(world.owner), email=email, role=role
    )


def test_invitation_accept_for_a_new_person(world, client):
    """Regression: the view used type(request.user).objects; request.user is a
    SimpleLazyObject, so every usable invitation link was a 500."""
    _, raw = invite(world, "newbie@example.test")

    form = client.get(accept_path(raw))
    assert form.status_code == 200
    assert "Create account and join" in page(form)
    response = client.post(
        accept_path(raw),
        {"full_name": "New Bie", "password1": STRONG_PASSWORD, "password2": STRONG_PASSWORD},
        follow=True,
    )

    assert response.redirect_chain == [(reverse("dashboard"), 302)]
    user = User.objects.get(email="newbie@example.test")
    assert response.wsgi_request.user == user
    assert response.wsgi_request.tenant == world.tenant
    assert response.wsgi_request.membership.role == Role.MEMBER
    assert f"You joined {world.tenant.name}" in page(response)


def test_invitation_accept_for_an_existing_account_goes_through_sign_in(world, client, password):
    existing = UserFactory(email="existing@example.test")
    _, raw = invite(world, existing.email, role=Role.FINANCE)
    path = accept_path(raw)

    assert "Sign in to accept" in page(client.get(path))
    response = client.post(path)
    assert response.status_code == 302
    assert response["Location"] == f"{LOGIN}?next={path}"
    assert not Membership.objects.filter(user=existing, tenant=world.tenant).exists()

    signed_in = sign_in(client, existing.email, password)
    assert signed_in.status_code == 302
    joined = client.post(path)
    assert joined.status_code == 302
    assert Membership.objects.get(user=existing, tenant=world.tenant).role == Role.FINANCE


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        ("expire", "This invitation has expired"),
        ("revoke", "This invitation was revoked"),
        ("use", "This invitation has already been used"),
    ],
)
def test_unusable_invitation_link_is_410_with_a_clear_message(world, client, spoil, message):
    invitation, raw = invite(world, "spoiled@example.test")
    if spoil == "expire":
        Invitation.objects.filter(pk=invitation.pk).update(
            expires_at=timezone.now() - timedelta(minutes=1)
        )
    elif spoil == "revoke":
        invitation_revoke(invitation=invitation, by_user=world.owner)
    else:
        invitation_accept(raw_token=raw, user=UserFactory(email="spoiled@example.test"))

    response = client.get(accept_path(raw))

    assert response.status_code == 410
    assert message in page(response)
    assert client.post(accept_path(raw), {}).status_code == 410


def test_unknown_invitation_link_is_404(client, db):
    response = client.get(accept_path("no-such-invitation"))

    assert response.status_code == 404
    assert "not valid" in page(response)


# --- API tokens page ----


def test_token_create_shows_the_value_once(world):
    client = signed_in_client(world.member, world.tenant)

    created = client.post(reverse("api_tokens"), {"name": "laptop"})

    assert created.status_code == 200
    token = ApiToken.objects.get(name="laptop")
    raw = re.search(r'value="(ggt_[^"]+)"[^>]*data-testid="new-token-value"', page(created))[1]
    assert api_token_authenticate(raw)[0] == token
    later = page(client.get(reverse("api_tokens")))
    assert "laptop" in later
    assert raw not in later
    assert token.prefix in later


def test_token_revoke_get_confirms_post_revokes(world):
    client = signed_in_client(world.member, world.tenant)
    token, raw = api_token_create(user=world.member, tenant=world.tenant, name="ci")
    url = reverse("api_token_revoke", args=[token.pk])

    confirm = client.get(url)
    assert confirm.status_code == 200
    assert "Revoke API token" in page(confirm)
    assert api_token_authenticate(raw) is not None

    revoked = client.post(url)
    assert revoked.status_code == 302
    assert revoked["Location"] == reverse("api_tokens")
    assert api_token_authenticate(raw) is None


def test_member_cannot_revoke_someone_elses_token(world):
    token, raw = api_token_create(user=world.owner, tenant=world.tenant, name="owner")

    response = signed_in_client(world.member, world.tenant).post(
        reverse("api_token_revoke", args=[token.pk])
    )

    assert response.status_code == 404
    assert api_token_authenticate(raw) is not None


def test_tokens_page_htmx_renders_only_the_partial(world):
    client = signed_in_client(world.member, world.tenant)

    full = page(client.get(reverse("api_tokens")))
    partial = page(client.post(reverse("api_tokens"), {"name": "via-htmx"}, **HTMX))

    assert "<html" in full
    assert "<html" not in partial
    assert partial.lstrip().startswith('<div id="token-area">')
    assert 'data-testid="new-token-value"' in partial


def test_token_revoke_by_htmx_answers_with_a_client_redirect(world):
    client = signed_in_client(world.member, world.tenant)
    token, _ = api_token_create(user=world.member, tenant=world.tenant, name="h")

    response = client.post(reverse("api_token_revoke", args=[token.pk]), **HTMX)

    assert response.status_code == 200
    assert response["HX-Redirect"] == reverse("api_tokens")


def test_owner_sees_everyones_tokens_member_only_own(world, owner_client):
    api_token_create(user=world.member, tenant=world.tenant, name="member-script")
    api_token_create(user=world.owner, tenant=world.tenant, name="owner-script")

    owner_page = page(owner_client.get(reverse("api_tokens")))
    member_page = page(signed_in_client(world.member, world.tenant).get(reverse("api_tokens")))

    assert "member-script" in owner_page
    assert "owner-script" in owner_page
    assert "member-script" in member_page
    assert "owner-script" not in member_page


# --- audit, switching, password ----


def test_audit_page_for_admin_403_for_member(world):
    api_token_create(user=world.member, tenant=world.tenant, name="audited-token")

    admin_page = signed_in_client(world.admin, world.tenant).get(reverse("audit_log"))
    member_page = signed_in_client(world.member, world.tenant).get(reverse("audit_log"))

    assert admin_page.status_code == 200
    assert "api_token.created" in page(admin_page)
    assert member_page.status_code == 403
    assert "Not allowed" in page(member_page)


def test_audit_page_filters_and_htmx_partial(world):
    api_token_create(user=world.member, tenant=world.tenant, name="t")
    invitation_create(
        tenant=world.tenant,
        by_membership=world.membership(world.owner),
        email="f@example.test",
        role="member",
    )
    client = signed_in_client(world.admin, world.tenant)

    filtered = page(client.get(reverse("audit_log"), {"action": "invitation."}, **HTMX))

    assert "<html" not in filtered
    assert "invitation.created" in filtered
    assert "api_token.created" not in filtered


def test_tenant_switcher_changes_the_request_tenant(world, other_world):
    MembershipFactory(tenant=other_world.tenant, user=world.member, role=Role.FINANCE)
    client = signed_in_client(world.member, world.tenant)
    assert client.get("/").wsgi_request.tenant == world.tenant

    response = client.post(reverse("tenant_switch"), {"tenant": other_world.tenant.slug})

    assert response.status_code == 302
    after = client.get("/")
    assert after.wsgi_request.tenant == other_world.tenant
    assert after.wsgi_request.membership.role == Role.FINANCE
    assert other_world.tenant.name in page(after)


def test_tenant_switch_by_htmx_is_a_client_redirect(world, other_world):
    MembershipFactory(tenant=other_world.tenant, user=world.member)
    client = signed_in_client(world.member, world.tenant)

    response = client.post(reverse("tenant_switch"), {"tenant": "globex"}, **HTMX)

    assert response["HX-Redirect"] == reverse("dashboard")
    assert client.get("/").wsgi_request.tenant == other_world.tenant


def test_password_change_works_and_is_audited(world, password):
    client = signed_in_client(world.member, world.tenant)
    new_password = "another-long-passphrase-23"

    response = client.post(
        reverse("password_change"),
        {"old_password": password, "new_password1": new_password, "new_password2": new_password},
        REMOTE_ADDR="198.51.100.40",
    )

    assert response.status_code == 302
    assert response["Location"] == reverse("dashboard")
    world.member.refresh_from_db()
    assert world.member.check_password(new_password)
    assert client.get("/").status_code == 200  # still signed in
    event = AuditEvent.objects.get(action="auth.password_changed")
    assert (event.actor, event.ip_address) == (world.member, "198.51.100.40")


def test_password_change_with_wrong_old_password_is_a_form_error(world):
    client = signed_in_client(world.member, world.tenant)

    response = client.post(
        reverse("password_change"),
        {
            "old_password": "nope",
            "new_password1": "x-long-pass-99",
            "new_password2": "x-long-pass-99",
        },
    )

    assert response.status_code == 200
    assert not AuditEvent.objects.filter(action="auth.password_changed").exists()


# --- staff ----


def test_staff_lists_and_creates_tenants(world):
    staff = UserFactory(email="staff@example.test", is_staff=True)
    client = signed_in_client(staff)

    listing = client.get(reverse("staff_tenants"))
    assert listing.status_code == 200
    assert world.tenant.name in page(listing)

    created = client.post(reverse("staff_tenants"), {"name": "Hooli"})
    tenant = Tenant.objects.get(name="Hooli")
    assert created.status_code == 302
    assert created["Location"] == reverse("staff_tenant_detail", args=[tenant.slug])
    detail = client.get(created["Location"])
    assert detail.status_code == 200
    assert "tenant.created" in page(detail)


@pytest.mark.parametrize("who", ["owner", "admin", "member"])
def test_staff_pages_are_404_for_others(world, who):
    client = signed_in_client(getattr(world, who), world.tenant)

    assert client.get(reverse("staff_tenants")).status_code == 404
    assert client.post(reverse("staff_tenants"), {"name": "Nope"}).status_code == 404
    assert client.get(reverse("staff_tenant_detail", args=[world.tenant.slug])).status_code == 404
    assert not Tenant.objects.filter(name="Nope").exists()


# --- health, seed, API 404 ----


HEALTHZ_TOKEN = "healthz-test-token"


def detailed_healthz(client, settings):
    """/healthz as a monitoring system with the token sees it (anonymous: status only)."""
    settings.HEALTHZ_TOKEN = HEALTHZ_TOKEN
    return client.get("/healthz", HTTP_AUTHORIZATION=f"Bearer {HEALTHZ_TOKEN}")


def test_healthz_shape(client, db, settings):
    heartbeats.heartbeat_record(component="worker")

    response = detailed_healthz(client, settings)

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert "failing" not in body
    assert set(body["components"]) == {
        "database",
        "redis",
        "worker",
        "beat",
        "watcher",
        "host_sandbox",  # the local backend is configured: are its jobs sandboxed?
    }
    worker = body["components"]["worker"]
    assert worker["status"] == "ok"
    assert {"last_seen", "age_seconds", "host", "pid"} <= set(worker)
    assert body["components"]["beat"] == {"status": "missing", "last_seen": None}
    assert "no-cache" in response["Cache-Control"]


def test_healthz_reports_a_stale_component_without_failing(client, db, settings):
    heartbeats.heartbeat_record(component="beat")
    Heartbeat.objects.filter(component="beat").update(
        last_seen=timezone.now() - timedelta(seconds=settings.HEARTBEAT_STALE_AFTER + 30)
    )

    body = detailed_healthz(client, settings).json()

    assert body["components"]["beat"]["status"] == "stale"
    assert body["status"] == "ok"  # only database and Redis make it 503


def test_seed_demo_creates_the_documented_users_and_is_idempotent(db):
    call_command("seed_demo", stdout=StringIO())
    first = (User.objects.count(), Tenant.objects.count(), Membership.objects.count())
    call_command("seed_demo", stdout=StringIO())

    assert (User.objects.count(), Tenant.objects.count(), Membership.objects.count()) == first
    assert first == (5, 2, 4)
    staff = User.objects.get(email="admin@example.com")
    assert staff.is_staff
    expected = {
        ("acme", "alice@acme.example"): Role.OWNER,
        ("acme", "dev@acme.example"): Role.MEMBER,
        ("acme", "fin@acme.example"): Role.FINANCE,
        ("globex", "bob@globex.example"): Role.OWNER,
    }
    roles = {
        (m.tenant.slug, m.user.email): m.role
        for m in Membership.objects.select_related("tenant", "user")
    }
    assert roles == expected
    for user in User.objects.all():
        assert user.check_password(settings.DEMO_PASSWORD), user.email


def test_seed_demo_users_can_sign_in(db, client):
    call_command("seed_demo", stdout=StringIO())

    response = sign_in(client, "Alice@Acme.example", settings.DEMO_PASSWORD)

    assert response.status_code == 302
    assert client.get("/").wsgi_request.tenant.slug == "acme"


def test_seed_demo_if_empty_leaves_an_existing_installation_alone(db):
    UserFactory()
    call_command("seed_demo", "--if-empty", stdout=StringIO())

    assert User.objects.count() == 1
    assert not Tenant.objects.exists()


@pytest.mark.parametrize("path", ["/api/v1/no-such-thing", "/api/v1/members/999999/"])
def test_404_under_api_is_json(owner_client, path):
    response = owner_client.get(path)

    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["detail"]


def test_404_outside_api_is_html(owner_client):
    response = owner_client.get("/no-such-page/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_dashboard_names_gpu_types_by_their_display_name(owner_client, world, catalog):
    JobFactory(
        tenant=world.tenant,
        pool=NodePoolFactory(gpu_type=catalog.gpu("a100-80gb"), node_count=2),
        nodes=2,
    )
    body = page(owner_client.get("/"))
    assert "2 nodes × 8 × A100 80GB SXM" in body and "a100-80gb" not in body
