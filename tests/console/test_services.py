"""console.services, called directly: the rules of sign-up, invitations, roles and tokens,
and the audit event each write leaves behind (with its actor and IP)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone

from console import heartbeats, registration
from console.models import (
    ApiToken,
    AuditEvent,
    Heartbeat,
    Invitation,
    Membership,
    Tenant,
    User,
    sha256_hex,
)
from console.permissions import Role
from console.service_errors import ServiceError
from console.services.accounts import signup_with_invitation
from console.services.audit import audit_record
from console.services.headers import client_ip
from console.services.invitations import (
    invitation_accept,
    invitation_create,
    invitation_for_token,
    invitation_revoke,
)
from console.services.memberships import membership_change_role, membership_remove
from console.services.tenants import tenant_create
from console.services.tokens import (
    LAST_USED_RESOLUTION_SECONDS,
    api_token_authenticate,
    api_token_create,
    api_token_revoke,
)
from tests.factories import InvitationFactory, MembershipFactory, UserFactory

CLIENT_IP = "203.0.113.7"
STRONG_PASSWORD = "a-long-unusual-passphrase-17"


@pytest.fixture
def request_from_ip():
    """A request as a view would pass it; no `user`, so services must name the actor."""
    return RequestFactory().post("/", REMOTE_ADDR=CLIENT_IP)


def open_signup(**kwargs):
    """registration.user_signup with the links a view would build."""
    return registration.user_signup(
        verify_link_for=lambda uidb64, token: f"http://console.test/verify/{uidb64}/{token}/",
        sign_in_url="http://console.test/login/",
        reset_url="http://console.test/reset/",
        **kwargs,
    )


def last_event(action: str) -> AuditEvent:
    return AuditEvent.objects.filter(action=action).latest("id")


def assert_audited(action: str, *, actor: User, tenant: Tenant | None, ip: str = CLIENT_IP):
    event = last_event(action)
    assert event.actor == actor
    assert event.actor_label == actor.email
    assert event.tenant == tenant
    assert event.ip_address == ip
    return event


# --- sign-up and tenants ----


def test_signup_creates_user_tenant_owner_membership_and_audit(db, request_from_ip):
    user, tenant = open_signup(
        email="  Ada@Example.TEST ",
        password=STRONG_PASSWORD,
        organisation_name="Analytical Engines",
        full_name="Ada L.",
        request=request_from_ip,
    )

    assert user.email == "ada@example.test"
    assert user.check_password(STRONG_PASSWORD)
    assert user.full_name == "Ada L."
    assert not user.is_active  # until the e-mailed link verifies the address
    assert tenant.name == "Analytical Engines"
    assert tenant.slug == "analytical-engines"
    assert Membership.objects.get(tenant=tenant, user=user).role == Role.OWNER
    assert_audited("tenant.created", actor=user, tenant=tenant)
    signed_up = assert_audited("user.signed_up", actor=user, tenant=tenant)
    assert signed_up.target_type == "user"
    assert signed_up.target_id == str(user.pk)


@pytest.mark.parametrize("email", ["taken@example.test", "TAKEN@Example.Test"])
def test_signup_with_an_existing_email_in_any_case_creates_nothing_and_raises_nothing(db, email):
    """The caller answers as for a new address (the owner is e-mailed): no conflict error
    that would tell a stranger the address has an account."""
    UserFactory(email="taken@example.test")

    assert open_signup(email=email, password=STRONG_PASSWORD, organisation_name="Dup") is None

    assert User.objects.filter(email__iexact="taken@example.test").count() == 1
    assert not Tenant.objects.filter(name="Dup").exists()


@pytest.mark.parametrize("weak", ["short", "password123", "12345678901234"])
def test_signup_refuses_a_weak_password(db, weak):
    with pytest.raises(ServiceError) as refused:
        open_signup(email="weak@example.test", password=weak, organisation_name="Weak")

    assert refused.value.field == "password1"
    assert refused.value.message
    assert not User.objects.filter(email="weak@example.test").exists()


def test_signup_without_organisation_name_leaves_no_user_behind(db):
    with pytest.raises(ServiceError) as refused:
        open_signup(email="noorg@example.test", password=STRONG_PASSWORD, organisation_name="   ")

    assert refused.value.field == "organisation_name"
    assert not User.objects.filter(email="noorg@example.test").exists()


def test_tenant_slugs_are_unique(db, request_from_ip):
    owner = UserFactory()
    first = tenant_create(name="Acme", owner=owner)
    second = tenant_create(name="ACME!", owner=owner)
    unnamed_slug = tenant_create(name="!!!", owner=owner)

    assert (first.slug, second.slug) == ("acme", "acme-2")
    assert unnamed_slug.slug == "org"
    with pytest.raises(ServiceError) as refused:
        tenant_create(name="Another", owner=owner, slug="acme")
    assert refused.value.code == "conflict"
    assert refused.value.field == "slug"
    assert not Tenant.objects.filter(name="Another").exists()


def test_tenant_create_makes_the_creator_owner_and_is_audited(db, request_from_ip):
    owner = UserFactory()

    tenant = tenant_create(name="Initech", owner=owner, request=request_from_ip)

    assert Membership.objects.get(tenant=tenant, user=owner).role == Role.OWNER
    event = assert_audited("tenant.created", actor=owner, tenant=tenant)
    assert event.target_repr == "Initech"


# --- invitations ----


def invite(world, *, by=None, email="new@example.test", role=Role.MEMBER, **kwargs):
    by_membership = world.membership(by or world.owner)
    return invitation_create(
        tenant=world.tenant, by_membership=by_membership, email=email, role=role, **kwargs
    )


def test_invitation_create_stores_only_a_hash_and_is_audited(world, request_from_ip):
    invitation, raw = invite(
        world, by=world.admin, email="New.Person@Example.test", request=request_from_ip
    )

    assert invitation.email == "new.person@example.test"
    assert invitation.token_hash == sha256_hex(raw)
    assert raw not in invitation.token_hash
    assert invitation.invited_by == world.admin
    assert invitation.state == "pending"
    assert invitation.expires_at > timezone.now() + timedelta(days=6)
    event = assert_audited("invitation.created", actor=world.admin, tenant=world.tenant)
    assert event.metadata == {"email": "new.person@example.test", "role": "member"}
    assert raw not in str(event.metadata)


def test_invitation_e_mail_is_queued_only_after_commit(world, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        invite(world, email="mailed@example.test", accept_url_for=lambda t: f"http://x/{t}")
    assert len(callbacks) == 1

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        invite(world, email="not-mailed@example.test")  # no link builder: nothing to send
    assert callbacks == []


def test_admin_cannot_invite_an_owner(world):
    with pytest.raises(ServiceError) as refused:
        invite(world, by=world.admin, role=Role.OWNER)

    assert refused.value.code == "forbidden"
    assert refused.value.field == "role"
    assert not Invitation.objects.filter(email="new@example.test").exists()


def test_owner_can_invite_an_owner(world):
    invitation, _ = invite(world, by=world.owner, role=Role.OWNER)
    assert invitation.role == Role.OWNER


def test_invitation_role_must_be_a_known_role(world):
    with pytest.raises(ServiceError) as refused:
        invite(world, role="superuser")
    assert refused.value.field == "role"


def test_inviting_an_existing_member_is_refused(world):
    with pytest.raises(ServiceError) as refused:
        invite(world, email=world.viewer.email.upper())

    assert refused.value.code == "conflict"
    assert "already a member" in refused.value.message


def test_a_second_pending_invitation_for_the_same_email_is_refused(world):
    invite(world, email="twice@example.test")

    with pytest.raises(ServiceError) as refused:
        invite(world, email="Twice@Example.test")
    assert refused.value.code == "conflict"
    assert "pending invitation" in refused.value.message


def test_a_revoked_invitation_can_be_replaced(world):
    first, _ = invite(world, email="again@example.test")
    invitation_revoke(invitation=first, by_user=world.owner)

    second, _ = invite(world, email="again@example.test")
    assert second.pk != first.pk


def test_invitation_accept_creates_membership_with_the_invited_role(world, request_from_ip):
    newcomer = UserFactory(email="finance.new@example.test")
    invitation, raw = invite(world, email=newcomer.email, role=Role.FINANCE)

    membership = invitation_accept(raw_token=raw, user=newcomer, request=request_from_ip)

    assert membership.tenant == world.tenant
    assert membership.role == Role.FINANCE
    invitation.refresh_from_db()
    assert invitation.state == "accepted"
    assert invitation.accepted_by == newcomer
    event = assert_audited("membership.joined", actor=newcomer, tenant=world.tenant)
    assert event.metadata["role"] == "finance"


def test_invitation_accept_refuses_another_email(world):
    _, raw = invite(world, email="intended@example.test")
    stranger = UserFactory(email="stranger@example.test")

    with pytest.raises(ServiceError) as refused:
        invitation_accept(raw_token=raw, user=stranger)

    assert refused.value.code == "forbidden"
    assert "intended@example.test" in refused.value.message
    assert not Membership.objects.filter(user=stranger).exists()


def test_invitation_is_single_use(world):
    invitee = UserFactory(email="once@example.test")
    _, raw = invite(world, email=invitee.email)
    invitation_accept(raw_token=raw, user=invitee)

    with pytest.raises(ServiceError) as refused:
        invitation_accept(raw_token=raw, user=invitee)

    assert refused.value.code == "conflict"
    assert "already been used" in refused.value.message
    assert Membership.objects.filter(user=invitee).count() == 1


def test_unusable_invitations_are_refused_with_distinct_messages(world):
    invitee = UserFactory(email="late@example.test")
    _, expired_raw = invite(world, email=invitee.email)
    Invitation.objects.filter(token_hash=sha256_hex(expired_raw)).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    revoked, revoked_raw = invite(world, email="revoked@example.test")
    invitation_revoke(invitation=revoked, by_user=world.owner)
    used_by = UserFactory(email="used@example.test")
    _, used_raw = invite(world, email=used_by.email)
    invitation_accept(raw_token=used_raw, user=used_by)

    messages = {}
    for kind, raw in [
        ("expired", expired_raw),
        ("revoked", revoked_raw),
        ("used", used_raw),
        ("unknown", "no-such-token"),
    ]:
        with pytest.raises(ServiceError) as refused:
            invitation_accept(raw_token=raw, user=invitee)
        messages[kind] = refused.value

    assert "expired" in messages["expired"].message
    assert "revoked" in messages["revoked"].message
    assert "already been used" in messages["used"].message
    assert messages["unknown"].code == "not_found"
    assert len({error.message for error in messages.values()}) == 4
    assert not Membership.objects.filter(user=invitee).exists()


def test_invitation_revoke_is_audited_once(world, request_from_ip):
    invitation, _ = invite(world, email="gone@example.test")

    invitation_revoke(invitation=invitation, by_user=world.admin, request=request_from_ip)
    invitation_revoke(invitation=invitation, by_user=world.admin, request=request_from_ip)

    assert invitation.state == "revoked"
    assert AuditEvent.objects.filter(action="invitation.revoked").count() == 1
    assert_audited("invitation.revoked", actor=world.admin, tenant=world.tenant)


def test_signup_with_invitation_creates_the_account_and_membership(world, request_from_ip):
    _, raw = invite(world, email="Joiner@Example.test", role=Role.VIEWER)

    user, membership = signup_with_invitation(
        raw_token=raw, password=STRONG_PASSWORD, full_name="Jo Iner", request=request_from_ip
    )

    assert user.email == "joiner@example.test"
    assert user.check_password(STRONG_PASSWORD)
    assert (membership.tenant, membership.user, membership.role) == (
        world.tenant,
        user,
        Role.VIEWER,
    )
    # No organisation of their own: the invitation's tenant is their only one.
    assert list(Membership.objects.filter(user=user)) == [membership]
    assert_audited("user.signed_up", actor=user, tenant=world.tenant)
    assert_audited("membership.joined", actor=user, tenant=world.tenant)


def test_signup_with_invitation_refuses_weak_password_and_keeps_the_link_usable(world):
    _, raw = invite(world, email="weakjoiner@example.test")

    with pytest.raises(ServiceError) as refused:
        signup_with_invitation(raw_token=raw, password="123")

    assert refused.value.field == "password1"
    assert not User.objects.filter(email="weakjoiner@example.test").exists()
    assert invitation_for_token(raw).state == "pending"


def test_signup_with_invitation_refuses_an_email_that_has_an_account(world):
    _, raw = invite(world, email="exists@example.test")
    UserFactory(email="exists@example.test")  # signed up on their own meanwhile

    with pytest.raises(ServiceError) as refused:
        signup_with_invitation(raw_token=raw, password=STRONG_PASSWORD)
    assert refused.value.field == "email"


def test_signup_with_expired_invitation_is_refused(world):
    invitation = InvitationFactory(
        tenant=world.tenant,
        email="expired@example.test",
        token_hash=sha256_hex("expired-raw"),
        expires_at=timezone.now() - timedelta(minutes=1),
    )

    with pytest.raises(ServiceError, match="expired"):
        signup_with_invitation(raw_token="expired-raw", password=STRONG_PASSWORD)
    assert not User.objects.filter(email=invitation.email).exists()


# --- roles and removal ----


def change_role(world, user, role, *, by, request=None):
    return membership_change_role(
        membership=world.membership(user),
        role=role,
        by_membership=world.membership(by),
        request=request,
    )


def test_owner_changes_a_role_and_it_is_audited(world, request_from_ip):
    membership = change_role(
        world, world.member, Role.ADMIN, by=world.owner, request=request_from_ip
    )

    assert membership.role == Role.ADMIN
    assert world.membership(world.member).role == Role.ADMIN
    event = assert_audited("membership.role_changed", actor=world.owner, tenant=world.tenant)
    assert event.metadata == {"from": "member", "to": "admin", "user": world.member.email}


def test_changing_to_the_same_role_writes_nothing(world):
    change_role(world, world.member, Role.MEMBER, by=world.owner)
    assert not AuditEvent.objects.filter(action="membership.role_changed").exists()


def test_the_last_owner_cannot_be_demoted(world):
    with pytest.raises(ServiceError) as refused:
        change_role(world, world.owner, Role.ADMIN, by=world.owner)

    assert refused.value.code == "conflict"
    assert "at least one owner" in refused.value.message
    assert world.membership(world.owner).role == Role.OWNER


def test_an_owner_can_step_down_once_there_is_another_owner(world):
    change_role(world, world.admin, Role.OWNER, by=world.owner)

    change_role(world, world.owner, Role.MEMBER, by=world.owner)

    assert world.membership(world.owner).role == Role.MEMBER


@pytest.mark.parametrize(
    ("target", "new_role"),
    [("owner", Role.ADMIN), ("owner", Role.MEMBER), ("member", Role.OWNER)],
)
def test_an_admin_cannot_touch_owners(world, target, new_role):
    second_owner = MembershipFactory(tenant=world.tenant, role=Role.OWNER).user
    subject = second_owner if target == "owner" else world.member

    with pytest.raises(ServiceError) as refused:
        change_role(world, subject, new_role, by=world.admin)

    assert refused.value.code == "forbidden"
    assert world.membership(subject).role == (Role.OWNER if target == "owner" else Role.MEMBER)


def test_an_admin_manages_non_owner_roles(world):
    change_role(world, world.viewer, Role.ADMIN, by=world.admin)
    change_role(world, world.finance, Role.VIEWER, by=world.admin)

    assert world.membership(world.viewer).role == Role.ADMIN
    assert world.membership(world.finance).role == Role.VIEWER


@pytest.mark.parametrize("actor", ["member", "viewer", "finance"])
def test_non_admins_cannot_change_roles(world, actor):
    with pytest.raises(ServiceError) as refused:
        change_role(world, world.member, Role.VIEWER, by=getattr(world, actor))
    assert refused.value.code == "forbidden"


def test_an_invalid_role_is_refused(world):
    with pytest.raises(ServiceError) as refused:
        change_role(world, world.member, "root", by=world.owner)
    assert refused.value.field == "role"


def test_removing_a_member_revokes_their_tokens_in_that_tenant_only(
    world, other_world, request_from_ip
):
    MembershipFactory(tenant=other_world.tenant, user=world.member, role=Role.MEMBER)
    _, here_raw = api_token_create(user=world.member, tenant=world.tenant, name="here")
    _, there_raw = api_token_create(user=world.member, tenant=other_world.tenant, name="there")

    membership_remove(
        membership=world.membership(world.member),
        by_membership=world.membership(world.admin),
        request=request_from_ip,
    )

    assert not Membership.objects.filter(tenant=world.tenant, user=world.member).exists()
    assert api_token_authenticate(here_raw) is None
    assert ApiToken.objects.get(name="here").revoked_at is not None
    there = api_token_authenticate(there_raw)
    assert there is not None
    assert there[0].tenant == other_world.tenant
    event = assert_audited("membership.removed", actor=world.admin, tenant=world.tenant)
    assert event.metadata == {"user": world.member.email, "role": "member"}


def test_admin_cannot_remove_an_owner(world):
    with pytest.raises(ServiceError) as refused:
        membership_remove(
            membership=world.membership(world.owner), by_membership=world.membership(world.admin)
        )
    assert refused.value.code == "forbidden"
    assert Membership.objects.filter(tenant=world.tenant, user=world.owner).exists()


def test_a_member_cannot_remove_someone_else(world):
    with pytest.raises(ServiceError) as refused:
        membership_remove(
            membership=world.membership(world.viewer), by_membership=world.membership(world.member)
        )
    assert refused.value.code == "forbidden"


def test_leaving_is_allowed_for_any_role_and_audited_as_left(world, request_from_ip):
    viewer_membership = world.membership(world.viewer)

    membership_remove(
        membership=viewer_membership, by_membership=viewer_membership, request=request_from_ip
    )

    assert not Membership.objects.filter(pk=viewer_membership.pk).exists()
    assert_audited("membership.left", actor=world.viewer, tenant=world.tenant)
    assert not AuditEvent.objects.filter(action="membership.removed").exists()


def test_the_last_owner_cannot_leave(world):
    owner_membership = world.membership(world.owner)

    with pytest.raises(ServiceError) as refused:
        membership_remove(membership=owner_membership, by_membership=owner_membership)

    assert refused.value.code == "conflict"
    assert Membership.objects.filter(pk=owner_membership.pk).exists()


# --- API tokens ----


def test_token_create_stores_the_hash_not_the_raw_value(world, request_from_ip):
    token, raw = api_token_create(
        user=world.member, tenant=world.tenant, name=" ci-pipeline ", request=request_from_ip
    )

    assert raw.startswith(ApiToken.PREFIX)
    assert len(raw) > 40
    token.refresh_from_db()
    assert token.name == "ci-pipeline"
    assert token.key_hash == sha256_hex(raw)
    assert token.prefix == raw[:12]
    stored = [str(v) for v in ApiToken.objects.filter(pk=token.pk).values().first().values()]
    assert raw not in stored
    event = assert_audited("api_token.created", actor=world.member, tenant=world.tenant)
    assert event.metadata == {"name": "ci-pipeline", "prefix": token.prefix}
    assert raw not in str(event.metadata)


@pytest.mark.parametrize(("name", "why"), [("", "name"), ("   ", "name"), ("x" * 101, "100")])
def test_token_create_refuses_bad_names(world, name, why):
    with pytest.raises(ServiceError) as refused:
        api_token_create(user=world.member, tenant=world.tenant, name=name)
    assert refused.value.field == "name"
    assert why in refused.value.message


def test_token_create_refuses_a_non_member(world, other_world):
    with pytest.raises(ServiceError) as refused:
        api_token_create(user=other_world.owner, tenant=world.tenant, name="sneaky")
    assert refused.value.code == "forbidden"
    assert not ApiToken.objects.filter(name="sneaky").exists()


def test_token_authenticate_returns_the_token_and_membership(world):
    token, raw = api_token_create(user=world.member, tenant=world.tenant, name="ok")

    found, membership = api_token_authenticate(raw)

    assert found == token
    assert (found.user, found.tenant) == (world.member, world.tenant)
    stored = Membership.objects.get(tenant=world.tenant, user=world.member)
    assert membership == stored
    assert (membership.role, membership.created_at) == (stored.role, stored.created_at)
    assert (membership.tenant, membership.user) == (world.tenant, world.member)


@pytest.mark.parametrize(
    "raw", ["", "ggt_", "ggt_not-a-real-token", "not-even-the-prefix", "ggt_" + "a" * 43]
)
def test_token_authenticate_refuses_unknown_values(world, raw):
    api_token_create(user=world.member, tenant=world.tenant, name="real")
    assert api_token_authenticate(raw) is None


def test_revoked_token_no_longer_authenticates_and_revoke_is_idempotent(world, request_from_ip):
    token, raw = api_token_create(user=world.member, tenant=world.tenant, name="old")

    api_token_revoke(token=token, by_user=world.owner, request=request_from_ip)
    first_revoked_at = token.revoked_at
    api_token_revoke(token=token, by_user=world.owner, request=request_from_ip)

    assert api_token_authenticate(raw) is None
    token.refresh_from_db()
    assert token.revoked_at == first_revoked_at
    assert AuditEvent.objects.filter(action="api_token.revoked").count() == 1
    event = assert_audited("api_token.revoked", actor=world.owner, tenant=world.tenant)
    assert event.metadata == {"name": "old", "owner": world.member.email}


def test_token_of_a_deactivated_user_or_tenant_does_not_authenticate(world):
    _, member_raw = api_token_create(user=world.member, tenant=world.tenant, name="a")
    _, viewer_raw = api_token_create(user=world.viewer, tenant=world.tenant, name="b")

    User.objects.filter(pk=world.member.pk).update(is_active=False)
    assert api_token_authenticate(member_raw) is None
    assert api_token_authenticate(viewer_raw) is not None

    Tenant.objects.filter(pk=world.tenant.pk).update(is_active=False)
    assert api_token_authenticate(viewer_raw) is None


def test_token_of_a_user_who_is_no_longer_a_member_does_not_authenticate(world):
    """Regression: membership was not checked, so a membership deleted outside
    membership_remove (the Django admin's tenant inline) left the token working."""
    _, raw = api_token_create(user=world.member, tenant=world.tenant, name="orphan")

    world.membership(world.member).delete()  # e.g. from the Django admin's tenant inline

    assert api_token_authenticate(raw) is None


def test_last_used_at_is_written_at_most_once_a_minute(world):
    token, raw = api_token_create(user=world.member, tenant=world.tenant, name="busy")
    assert token.last_used_at is None

    api_token_authenticate(raw)
    token.refresh_from_db()
    first_use = token.last_used_at
    assert first_use is not None

    api_token_authenticate(raw)
    token.refresh_from_db()
    assert token.last_used_at == first_use  # within the minute: no write

    a_while_ago = timezone.now() - timedelta(seconds=LAST_USED_RESOLUTION_SECONDS + 5)
    token.last_used_at = a_while_ago
    token.save(update_fields=["last_used_at"])  # (a save: the kept token is dropped)
    api_token_authenticate(raw)
    token.refresh_from_db()
    assert token.last_used_at > a_while_ago + timedelta(seconds=5)


def test_authenticating_within_the_minute_makes_no_write(world, django_assert_num_queries):
    _, raw = api_token_create(user=world.member, tenant=world.tenant, name="quiet")
    api_token_authenticate(raw)  # its first use: written, its kept copy dropped
    api_token_authenticate(raw)  # read again, and kept

    with django_assert_num_queries(0):  # kept: no lookup, no write
        api_token_authenticate(raw)


# --- audit helpers and heartbeats ----


def test_audit_record_takes_the_actor_from_the_request_user(world):
    request = RequestFactory().get("/", REMOTE_ADDR="198.51.100.1")
    request.user = world.member

    event = audit_record(action="test.did", tenant=world.tenant, request=request)

    assert (event.actor, event.actor_label, event.ip_address) == (
        world.member,
        world.member.email,
        "198.51.100.1",
    )


def test_audit_record_without_actor_is_system(db):
    event = audit_record(action="test.system")
    assert (event.actor, event.actor_label, event.ip_address, event.tenant) == (
        None,
        "system",
        None,
        None,
    )


def test_client_ip_ignores_forwarded_for_unless_a_proxy_is_trusted(settings):
    request = RequestFactory().get(
        "/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.9"
    )

    settings.AXES_IPWARE_PROXY_COUNT = None
    assert client_ip(request) == "10.0.0.1"
    # One trusted proxy: the address it saw (the right-most), not the spoofable left-most.
    settings.AXES_IPWARE_PROXY_COUNT = 1
    assert client_ip(request) == "198.51.100.9"


def test_heartbeat_record_creates_then_updates_one_row(db):
    heartbeats.heartbeat_record(component="worker")
    first = Heartbeat.objects.get(component="worker").last_seen
    heartbeats.heartbeat_record(component="worker")

    assert Heartbeat.objects.filter(component="worker").count() == 1
    assert Heartbeat.objects.get(component="worker").last_seen >= first
