"""Issue 13: who may create an account (SIGNUP), e-mail verification before the first
sign-in, password reset by e-mail, and sign-in throttling per IP across accounts.

Every test performs the trigger through the real pages; mail is what the real e-mail task
sends (run in-process, see `worker_outbox`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from django.test import Client, override_settings
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from console import registration
from console.models import ApiToken, AuditEvent, Membership, Tenant, User
from console.permissions import Role
from console.service_errors import ServiceError
from console.services.accounts import signup_with_invitation
from console.services.invitations import invitation_create
from console.services.tokens import api_token_create
from tests.factories import MembershipFactory, TenantFactory, UserFactory

STRONG = "a-long-unusual-passphrase-17"
NEW_PASSWORD = "another-quite-long-phrase-42"
LOGIN = reverse("login")
SIGNUP = reverse("signup")
RESET = reverse("password_reset")
VERIFY_LINK = re.compile(r"http://testserver(/accounts/verify/[\w-]+/[\w-]+/)")
RESET_LINK = re.compile(r"http://testserver(/accounts/password/reset/[\w-]+/[\w-]+/)")
UNVERIFIED = "Verify your e-mail address first"
WRONG = "E-mail or password is wrong"


def page(response) -> str:
    return response.content.decode()


CSRF_VALUE = re.compile(r'(CSRFToken": "|name="csrfmiddlewaretoken" value=")[^"]+')


def page_without_csrf(response) -> str:
    """The page as every visitor gets it (each session has its own CSRF token)."""
    return CSRF_VALUE.sub(r"\1…", page(response))


def signup_form(email: str, **overrides) -> dict:
    return {
        "full_name": "Grace H.",
        "email": email,
        "organisation_name": "Compilers Inc",
        "password1": STRONG,
        "password2": STRONG,
        **overrides,
    }


def sign_in(client: Client, email: str, password: str, ip: str = "127.0.0.1"):
    return client.post(LOGIN, {"username": email, "password": password}, REMOTE_ADDR=ip)


def link_in(message, pattern: re.Pattern) -> str:
    found = pattern.search(message.body)
    assert found is not None, message.body
    return found.group(1)


@pytest.fixture
def signed_up(db, client, worker_outbox, django_capture_on_commit_callbacks):
    """An open sign-up through the page; returns the account and its verification path."""
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(SIGNUP, signup_form("grace@example.test"))
    assert response.status_code == 302
    assert response["Location"] == reverse("signup_sent")
    user = User.objects.get(email="grace@example.test")
    (message,) = worker_outbox
    assert message.to == ["grace@example.test"]
    worker_outbox.clear()
    return user, link_in(message, VERIFY_LINK)


# --- the SIGNUP policy ----


def _settings_in_child(**env: str) -> subprocess.CompletedProcess:
    """Import the settings in a fresh interpreter, as a server start would."""
    child_env = {k: v for k, v in os.environ.items() if k not in {"SIGNUP", "GPUGEEK_ENV"}}
    child_env.update(env, DJANGO_SETTINGS_MODULE="console.settings")
    code = "from django.conf import settings; print(settings.SIGNUP)"
    return subprocess.run(
        [sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=60
    )


def test_signup_defaults_to_open_embedded_and_invite_in_production_and_refuses_typos():
    production = {
        "GPUGEEK_ENV": "production",
        "SECRET_KEY": "x" * 60,
        "ALLOWED_HOSTS": "console.example",
        "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none",
        "REDIS_URL": "redis://127.0.0.1:1/0",
    }

    embedded = _settings_in_child()
    in_production = _settings_in_child(**production)
    typo = _settings_in_child(SIGNUP="invites")

    assert embedded.stdout.strip() == "open", embedded.stderr
    assert in_production.stdout.strip() == "invite", in_production.stderr
    assert typo.returncode != 0
    assert "ImproperlyConfigured: SIGNUP must be 'open', 'invite' or 'closed'" in typo.stderr


@override_settings(SIGNUP="open")
def test_open_policy_offers_the_sign_up_form_and_links_to_it(client, db):
    assert 'name="organisation_name"' in page(client.get(SIGNUP))
    assert f'href="{SIGNUP}"' in page(client.get(LOGIN))


@pytest.mark.parametrize(
    ("policy", "says"), [("invite", "by invitation"), ("closed", "Sign-up is closed")]
)
def test_invite_and_closed_policies_refuse_the_sign_up_post_and_say_so(
    client, db, worker_outbox, django_capture_on_commit_callbacks, policy, says
):
    with override_settings(SIGNUP=policy):
        form_page = client.get(SIGNUP)
        login_page = client.get(LOGIN)
        with django_capture_on_commit_callbacks(execute=True):
            posted = client.post(SIGNUP, signup_form("stranger@example.test"))
        with pytest.raises(ServiceError) as refused:
            registration.user_signup(
                email="direct@example.test",
                password=STRONG,
                organisation_name="Direct",
                verify_link_for=lambda uid, token: "",
                sign_in_url="",
                reset_url="",
            )

    assert form_page.status_code == 200
    assert says in page(form_page)
    assert 'name="password1"' not in page(form_page)
    assert says in page(login_page)
    assert f'href="{SIGNUP}"' not in page(login_page)
    assert posted.status_code == 403
    assert says in page(posted)
    assert refused.value.code == "forbidden"
    assert not User.objects.filter(email__in=["stranger@example.test", "direct@example.test"])
    assert not Tenant.objects.exists()
    assert worker_outbox == []


@override_settings(SIGNUP="invite")
def test_invite_policy_still_lets_an_invited_person_create_their_account(world, client):
    _, raw = invitation_create(
        tenant=world.tenant,
        by_membership=world.membership(world.owner),
        email="joiner@example.test",
        role=Role.MEMBER,
    )

    response = client.post(
        reverse("invitation_accept", args=[raw]),
        {"full_name": "Jo", "password1": STRONG, "password2": STRONG},
    )

    assert response.status_code == 302
    user = User.objects.get(email="joiner@example.test")
    assert user.is_active  # the invitation proved the address
    assert Membership.objects.get(user=user).tenant == world.tenant
    assert client.get("/").wsgi_request.user == user


@override_settings(SIGNUP="closed")
def test_closed_policy_refuses_an_invitation_sign_up_but_lets_members_accept(world, client):
    by = world.membership(world.owner)
    _, raw_new = invitation_create(
        tenant=world.tenant, by_membership=by, email="newcomer@example.test", role=Role.MEMBER
    )
    other = UserFactory(email="has-account@example.test")
    _, raw_existing = invitation_create(
        tenant=world.tenant, by_membership=by, email=other.email, role=Role.VIEWER
    )

    refused = client.post(
        reverse("invitation_accept", args=[raw_new]),
        {"full_name": "New", "password1": STRONG, "password2": STRONG},
        follow=True,
    )
    with pytest.raises(ServiceError) as direct:
        signup_with_invitation(raw_token=raw_new, password=STRONG)
    existing_client = Client()
    existing_client.force_login(other, backend="console.auth_backends.EmailBackend")
    accepted = existing_client.post(reverse("invitation_accept", args=[raw_existing]))

    assert "Sign-up is closed" in page(refused)
    assert direct.value.code == "forbidden"
    assert not User.objects.filter(email="newcomer@example.test").exists()
    assert accepted.status_code == 302  # joining needs no new account
    assert Membership.objects.get(user=other).role == Role.VIEWER


@override_settings(SIGNUP="closed")
def test_closed_policy_leaves_account_creation_to_staff_in_django_admin(db):
    staff = UserFactory(email="root@example.test", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff, backend="console.auth_backends.EmailBackend")

    response = client.post(
        reverse("admin:console_user_add"),
        {"email": "made-by-staff@example.test", "password1": STRONG, "password2": STRONG},
    )

    assert response.status_code == 302, page(response)
    assert User.objects.get(email="made-by-staff@example.test").is_active


# --- e-mail verification ----


@override_settings(SIGNUP="open")
def test_open_sign_up_creates_an_inactive_account_that_cannot_sign_in(
    signed_up, client, worker_outbox, django_capture_on_commit_callbacks
):
    user, _link = signed_up
    token_api = Client().post(
        reverse("api-auth-token"),
        {"email": user.email, "password": STRONG, "name": "ci"},
        content_type="application/json",
    )
    wrong = sign_in(Client(), user.email, "not-the-password")
    with django_capture_on_commit_callbacks(execute=True):
        right = sign_in(client, user.email, STRONG)

    assert not user.is_active
    assert Membership.objects.get(user=user).role == Role.OWNER
    assert token_api.status_code == 403  # the right password: "verify first", no failure
    assert WRONG in page(wrong) and UNVERIFIED not in page(wrong)  # no hint without the password
    assert right.status_code == 200
    assert UNVERIFIED in page(right)
    assert not right.wsgi_request.user.is_authenticated
    (again,) = worker_outbox  # the link is sent again, only to the address itself
    assert again.to == [user.email]
    assert VERIFY_LINK.search(again.body)


@override_settings(SIGNUP="open")
def test_the_verification_link_activates_the_account_once_and_signs_in(signed_up, client):
    user, link = signed_up

    shown = client.get(link)  # a mail scanner's GET activates nothing
    assert shown.status_code == 200
    assert 'type="submit"' in page(shown) and 'name="password"' in page(shown)
    user.refresh_from_db()
    assert not user.is_active

    activated = client.post(link, {"password": STRONG}, follow=True)

    assert activated.redirect_chain == [(reverse("dashboard"), 302)]
    assert activated.wsgi_request.user == user
    assert activated.wsgi_request.tenant.name == "Compilers Inc"
    assert "Compilers Inc is ready" in page(activated)
    user.refresh_from_db()
    assert user.is_active
    assert AuditEvent.objects.filter(action="user.email_verified", actor=user).count() == 1

    second_get, second_post = Client().get(link), Client().post(link, {"password": STRONG})
    assert second_get.status_code == second_post.status_code == 400
    assert "not valid" in page(second_post)
    assert AuditEvent.objects.filter(action="user.email_verified").count() == 1
    assert sign_in(Client(), user.email, STRONG).status_code == 302


@override_settings(SIGNUP="open")
def test_a_forged_truncated_or_expired_verification_link_is_refused(signed_up, monkeypatch):
    user, link = signed_up
    uidb64, token = link.strip("/").split("/")[-2:]
    other = UserFactory(email="victim@example.test", is_active=False)
    other_uid = urlsafe_base64_encode(force_bytes(other.pk))
    bad_paths = [
        f"/accounts/verify/{uidb64}/{token[:-2]}xx/",  # tampered
        f"/accounts/verify/{uidb64}/{token.split('-')[0]}/",  # truncated
        f"/accounts/verify/{other_uid}/{token}/",  # someone else's account
        f"/accounts/verify/not-base64/{token}/",
    ]
    responses = [Client().post(path, {"password": STRONG}) for path in bad_paths]
    # A day and an hour later (PASSWORD_RESET_TIMEOUT is a day): the clock moves on.
    later = datetime.now() + timedelta(hours=25)
    monkeypatch.setattr(registration.email_verification_tokens, "_now", lambda: later)
    expired = Client().post(link, {"password": STRONG})

    assert [r.status_code for r in responses] == [400] * len(bad_paths)
    assert expired.status_code == 400
    assert "expired" in page(expired)
    user.refresh_from_db()
    other.refresh_from_db()
    assert not user.is_active and not other.is_active


@override_settings(SIGNUP="open")
def test_sign_up_with_an_existing_address_reveals_nothing_and_mails_its_owner(
    db, worker_outbox, django_capture_on_commit_callbacks
):
    owner = UserFactory(email="taken@example.test")
    password_before = owner.password

    with django_capture_on_commit_callbacks(execute=True):
        known = Client().post(SIGNUP, signup_form("TAKEN@example.test"), follow=True)
    with django_capture_on_commit_callbacks(execute=True):
        unknown = Client().post(SIGNUP, signup_form("fresh@example.test"), follow=True)

    assert known.status_code == unknown.status_code == 200
    assert known.redirect_chain == unknown.redirect_chain == [(reverse("signup_sent"), 302)]
    assert page_without_csrf(known) == page_without_csrf(unknown)
    assert "already" not in page(known)
    owner.refresh_from_db()
    assert owner.password == password_before
    assert User.objects.filter(email__iexact="taken@example.test").count() == 1
    assert not Membership.objects.filter(user=owner).exists()  # no organisation made for it
    to_owner, to_new = worker_outbox
    assert to_owner.to == ["taken@example.test"]
    assert "already has an account" in to_owner.body
    assert f"http://testserver{RESET}" in to_owner.body
    assert to_new.to == ["fresh@example.test"] and VERIFY_LINK.search(to_new.body)


@override_settings(SIGNUP="open")
def test_signing_up_again_before_verifying_replaces_the_unverified_account(
    signed_up, client, worker_outbox, django_capture_on_commit_callbacks
):
    """Account pre-hijacking (audit, issue 26): someone signs up with another person's
    address and their own password, and never verifies. When the address's owner signs
    up, the account is theirs: their password, name and a fresh organisation; nothing
    the earlier sign-up set survives, and its link is dead."""
    squatter, squatters_link = signed_up  # "Grace H." with STRONG, "Compilers Inc"
    squatters_org = Tenant.objects.get(memberships__user=squatter)
    # What an unverified account could hold: a token and a membership elsewhere (staff
    # can add an inactive account), and a pending invitation to its organisation.
    api_token_create(user=squatter, tenant=squatters_org, name="theirs")
    elsewhere = TenantFactory(name="Elsewhere")
    MembershipFactory(tenant=elsewhere, user=squatter, role=Role.MEMBER)
    MembershipFactory(tenant=elsewhere, role=Role.OWNER)

    with django_capture_on_commit_callbacks(execute=True):
        again = Client().post(
            SIGNUP,
            signup_form(
                squatter.email.upper(),
                full_name="The Real Grace",
                organisation_name="Real Compilers",
                password1=NEW_PASSWORD,
                password2=NEW_PASSWORD,
            ),
        )

    assert again["Location"] == reverse("signup_sent")  # as for any sign-up
    owner = User.objects.get(email=squatter.email)
    assert owner.pk != squatter.pk and not owner.is_active
    assert owner.full_name == "The Real Grace"
    assert owner.check_password(NEW_PASSWORD) and not owner.check_password(STRONG)
    assert [m.tenant.name for m in Membership.objects.filter(user=owner)] == ["Real Compilers"]
    assert Membership.objects.get(user=owner).role == Role.OWNER
    assert not Tenant.objects.filter(pk=squatters_org.pk).exists()
    assert not Membership.objects.filter(user_id=squatter.pk).exists()
    assert not ApiToken.objects.filter(user_id=squatter.pk).exists()
    assert Tenant.objects.filter(pk=elsewhere.pk).exists()  # others' organisation stays
    assert Membership.objects.filter(tenant=elsewhere).count() == 1
    discarded = AuditEvent.objects.get(action="user.unverified_discarded")
    assert discarded.target_id == str(squatter.pk)
    assert discarded.metadata == {"organisations": ["Compilers Inc"]}

    (message,) = worker_outbox
    assert message.to == [squatter.email]
    new_link = link_in(message, VERIFY_LINK)
    assert Client().post(squatters_link, {"password": STRONG}).status_code == 400  # dead
    assert sign_in(Client(), squatter.email, STRONG).status_code == 200  # refused
    activated = client.post(new_link, {"password": NEW_PASSWORD}, follow=True)
    assert activated.redirect_chain == [(reverse("dashboard"), 302)]
    assert activated.wsgi_request.user == owner
    assert activated.wsgi_request.tenant.name == "Real Compilers"
    assert sign_in(Client(), owner.email, STRONG).status_code == 200  # still refused
    assert sign_in(Client(), owner.email, NEW_PASSWORD).status_code == 302


@override_settings(SIGNUP="open")
def test_a_link_activates_only_with_the_password_of_its_sign_up(
    signed_up, client, worker_outbox, django_capture_on_commit_callbacks
):
    """The other order: the owner signs up first, then someone signs up again with their
    address and another password. The link that reaches the owner is for the later
    account, whose password the owner doesn't know: it can't activate it, so the later
    sign-up never gets an account the owner uses; signing up again takes it back."""
    owner, owners_link = signed_up  # the owner's password: STRONG
    with django_capture_on_commit_callbacks(execute=True):
        client.post(SIGNUP, signup_form(owner.email, password1="x" + NEW_PASSWORD,
                                        password2="x" + NEW_PASSWORD))  # fmt: skip
    (squatters_mail,) = worker_outbox
    squatters_link = link_in(squatters_mail, VERIFY_LINK)

    assert Client().post(owners_link, {"password": STRONG}).status_code == 400  # replaced
    refused = Client().post(squatters_link, {"password": STRONG})
    assert refused.status_code == 200
    assert "someone else signed up with your address" in page(refused)
    assert not refused.wsgi_request.user.is_authenticated
    assert not User.objects.get(email=owner.email).is_active
    assert Client().post(squatters_link, {}).status_code == 200  # no password: the form again
    assert not User.objects.get(email=owner.email).is_active

    worker_outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(SIGNUP, signup_form(owner.email))  # the owner again, with STRONG
    (owners_mail,) = worker_outbox
    assert Client().post(squatters_link, {"password": "x" + NEW_PASSWORD}).status_code == 400
    activated = Client().post(link_in(owners_mail, VERIFY_LINK), {"password": STRONG})
    assert activated.status_code == 302
    assert User.objects.get(email=owner.email).is_active


@override_settings(SIGNUP="open")
def test_a_verified_or_used_account_is_never_replaced_by_a_sign_up(
    db, worker_outbox, django_capture_on_commit_callbacks
):
    verified = UserFactory(email="verified@example.test")
    deactivated = UserFactory(email="deactivated@example.test", is_active=False)
    deactivated.last_login = deactivated.date_joined  # it was used, then staff stopped it
    deactivated.save(update_fields=["last_login"])
    before = {u.pk: u.password for u in (verified, deactivated)}

    for user in (verified, deactivated):
        with django_capture_on_commit_callbacks(execute=True):
            Client().post(SIGNUP, signup_form(user.email, password1=NEW_PASSWORD,
                                              password2=NEW_PASSWORD))  # fmt: skip

    assert {u.pk: u.password for u in User.objects.all()} == before
    assert not Tenant.objects.exists()
    assert [m.to for m in worker_outbox] == [[verified.email], [deactivated.email]]
    assert all("already has an account" in m.body for m in worker_outbox)


@override_settings(SIGNUP="invite")
def test_an_invitation_replaces_an_unverified_account_of_its_address(world, client):
    """The invitation proves the address: an earlier unverified sign-up with it (open
    sign-up since closed, or someone else's) neither blocks the invitee nor survives."""
    squatter = UserFactory(email="joiner@example.test", is_active=False, full_name="Not Jo")
    squatters_org = TenantFactory(name="Squat")
    MembershipFactory(tenant=squatters_org, user=squatter, role=Role.OWNER)
    _, raw = invitation_create(
        tenant=world.tenant,
        by_membership=world.membership(world.owner),
        email="joiner@example.test",
        role=Role.MEMBER,
    )
    url = reverse("invitation_accept", args=[raw])

    offered = client.get(url)
    assert 'name="password1"' in page(offered)  # a new person's form, not "sign in first"
    weak = client.post(url, {"full_name": "Jo", "password1": "123", "password2": "123"})
    assert "too short" in page(weak)
    assert User.objects.get(email="joiner@example.test").pk == squatter.pk  # rolled back
    response = client.post(url, {"full_name": "Jo", "password1": STRONG, "password2": STRONG})

    assert response.status_code == 302
    user = User.objects.get(email="joiner@example.test")
    assert user.pk != squatter.pk and user.is_active and user.full_name == "Jo"
    assert [m.tenant for m in Membership.objects.filter(user=user)] == [world.tenant]
    assert not Tenant.objects.filter(pk=squatters_org.pk).exists()
    assert client.get("/").wsgi_request.user == user


@override_settings(SIGNUP="open")
def test_sign_up_form_errors_do_not_depend_on_whether_the_address_is_known(db):
    UserFactory(email="taken@example.test")
    weak = {"password1": "123", "password2": "123"}

    known = Client().post(SIGNUP, signup_form("taken@example.test", **weak))
    unknown = Client().post(SIGNUP, signup_form("weak@example.test", **weak))

    assert known.status_code == unknown.status_code == 200
    errors = re.compile(r'<small class="error"[^>]*>(.*?)</small>')
    assert errors.findall(page(known)) == errors.findall(page(unknown))
    assert "too short" in page(known)
    assert not User.objects.filter(email="weak@example.test").exists()


# --- password reset ----


def _reset(client: Client, email: str, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        return client.post(RESET, {"email": email}, follow=True)


def test_password_reset_by_email_changes_the_password_once(
    world, client, worker_outbox, django_capture_on_commit_callbacks, password
):
    assert 'href="/accounts/password/reset/"' in page(client.get(LOGIN))

    sent = _reset(client, "Member@Acme.test", django_capture_on_commit_callbacks)

    assert sent.redirect_chain == [(reverse("password_reset_done"), 302)]
    (message,) = worker_outbox
    assert message.to == [world.member.email]
    link = link_in(message, RESET_LINK)
    form = client.get(link, follow=True)
    assert 'name="new_password1"' in page(form)
    done = client.post(
        form.redirect_chain[-1][0],
        {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
        follow=True,
    )
    assert done.redirect_chain == [(reverse("password_reset_complete"), 302)]
    assert "Password changed" in page(done)

    assert sign_in(Client(), world.member.email, password).status_code == 200  # old: refused
    assert sign_in(Client(), world.member.email, NEW_PASSWORD).status_code == 302
    reused = Client().get(link, follow=True)
    assert "Link not usable" in page(reused)
    assert 'name="new_password1"' not in page(reused)
    assert AuditEvent.objects.filter(action="auth.password_reset", actor=world.member).exists()


def test_password_reset_answers_alike_for_known_unknown_and_unverified_addresses(
    world, worker_outbox, django_capture_on_commit_callbacks
):
    UserFactory(email="unverified@example.test", is_active=False)

    answers = [
        _reset(Client(), email, django_capture_on_commit_callbacks)
        for email in ["member@acme.test", "nobody@example.test", "unverified@example.test"]
    ]

    assert {a.status_code for a in answers} == {200}
    assert {tuple(a.redirect_chain) for a in answers} == {((reverse("password_reset_done"), 302),)}
    assert len({page_without_csrf(a) for a in answers}) == 1
    assert [m.to for m in worker_outbox] == [["member@acme.test"]]


# --- sign-in throttling per IP, across accounts ----


@override_settings(AXES_FAILURE_LIMIT=5, AXES_IP_FAILURE_LIMIT=8)
def test_one_ip_failing_across_many_accounts_is_locked_out_for_every_account(db, password):
    accounts = [UserFactory(email=f"target{n}@example.test") for n in range(5)]
    spraying_ip, elsewhere = "203.0.113.7", "203.0.113.99"

    # Two guesses per account: never the per-account limit, 8 in all from one address.
    early = [
        sign_in(Client(), account.email, f"guess-{n}", ip=spraying_ip).status_code
        for account in accounts[:4]
        for n in range(2)
    ]
    fresh_account_right_password = sign_in(Client(), accounts[4].email, password, ip=spraying_ip)
    same_account_elsewhere = sign_in(Client(), accounts[4].email, password, ip=elsewhere)

    assert early[:7] == [200] * 7
    assert early[7] == 429  # the 8th failure from the address locks it out
    assert fresh_account_right_password.status_code == 429
    assert not fresh_account_right_password.wsgi_request.user.is_authenticated
    assert "Too many failed sign-in attempts from your address" in page(
        fresh_account_right_password
    )
    assert same_account_elsewhere.status_code == 302


@override_settings(AXES_FAILURE_LIMIT=5, AXES_IP_FAILURE_LIMIT=8)
def test_signing_in_to_ones_own_account_does_not_reset_the_ip_counter(db, password):
    attacker = UserFactory(email="attacker@example.test")
    victims = [UserFactory(email=f"victim{n}@example.test") for n in range(4)]
    ip = "203.0.113.8"

    for victim in victims:
        sign_in(Client(), victim.email, "guess-a", ip=ip)
        assert sign_in(Client(), attacker.email, password, ip=ip).status_code == 302
        sign_in(Client(), victim.email, "guess-b", ip=ip)

    assert sign_in(Client(), victims[0].email, password, ip=ip).status_code == 429


@override_settings(AXES_FAILURE_LIMIT=5, AXES_IP_FAILURE_LIMIT=8, AXES_IPWARE_PROXY_COUNT=1)
def test_behind_a_trusted_proxy_the_ip_limit_counts_the_forwarded_client(db, password):
    """TRUSTED_PROXY_COUNT=1: the client is the address the proxy appended, so one
    sprayer behind the proxy is locked out and everyone else behind it is not."""
    accounts = [UserFactory(email=f"proxied{n}@example.test") for n in range(4)]
    proxy = "10.0.0.2"

    def through_proxy(email: str, secret: str, client_ip: str):
        return Client().post(
            LOGIN,
            {"username": email, "password": secret},
            REMOTE_ADDR=proxy,
            HTTP_X_FORWARDED_FOR=f"198.51.100.1, {client_ip}",  # the first part is forgeable
        )

    for account in accounts:
        for n in range(2):
            through_proxy(account.email, f"guess-{n}", "203.0.113.50")

    sprayer = through_proxy(accounts[0].email, password, "203.0.113.50")
    neighbour = through_proxy(accounts[0].email, password, "203.0.113.51")

    assert sprayer.status_code == 429
    assert neighbour.status_code == 302
    assert not AuditEvent.objects.filter(ip_address=proxy).exists()  # the client, not the proxy
