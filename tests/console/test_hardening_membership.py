"""Issue 13 §3: a person removed from an organisation, or whose role no longer allows
watching, loses their open live sockets within seconds; invitations they sent and that
are still pending are revoked; an invitation is accepted only while its sender may still
grant its role.

The sockets go through the real ASGI stack and the real Redis channel layer (see
tests/jobs/test_consumers.py); the membership services are the ones the members page and
the API call.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.db import database_sync_to_async

from console.models import AuditEvent, Invitation, Membership
from console.permissions import ROLE_CAPABILITIES, Capability, Role
from console.service_errors import ServiceError
from console.services.accounts import signup_with_invitation
from console.services.invitations import invitation_accept, invitation_create
from console.services.memberships import membership_change_role, membership_remove
from jobs import realtime
from tests.conftest import signed_in_client
from tests.factories import UserFactory
from tests.jobs.test_consumers import TIMEOUT, communicator, make_job, run, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

WITHIN_SECONDS = 5


async def closed_code(socket, timeout: float = WITHIN_SECONDS) -> int:
    """Wait for the server to close the socket (other messages are skipped); its code."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, "the socket is still open"
        output = await socket.receive_output(timeout=left)
        if output["type"] == "websocket.close":
            return output["code"]


async def outputs_for(socket, *, seconds: float) -> list[dict]:
    """Everything the server sends in the next `seconds` (receive_nothing, unlike a
    receive that times out, leaves the application running)."""
    outputs: list[dict] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if not await socket.receive_nothing(timeout=min(left, 0.1)):
            outputs.append(await socket.receive_output(timeout=TIMEOUT))
    return outputs


async def open_socket(path: str, cookie: bytes):
    socket = communicator(path, cookie=cookie)
    connected, _ = await socket.connect(timeout=TIMEOUT)
    assert connected
    await asyncio.sleep(0.3)  # the hub has joined the groups
    return socket


def remove(world, user, *, by):
    membership_remove(membership=world.membership(user), by_membership=world.membership(by))


def change_role(world, user, role, *, by):
    membership_change_role(
        membership=world.membership(user), role=role, by_membership=world.membership(by)
    )


# --- live sockets ------------------------------------------------------------------------


def test_removing_a_member_closes_their_open_job_and_tenant_sockets(world, catalog):
    job = make_job(world.tenant)
    cookie = session_cookie(world.member, world.tenant)

    async def body():
        job_socket = await open_socket(f"/ws/jobs/{job.pk}/", cookie)
        tenant_socket = await open_socket("/ws/tenant/", cookie)
        started = time.monotonic()
        await database_sync_to_async(remove)(world, world.member, by=world.admin)
        codes = [await closed_code(job_socket), await closed_code(tenant_socket)]
        elapsed = time.monotonic() - started
        await job_socket.disconnect()
        await tenant_socket.disconnect()
        return codes, elapsed

    codes, elapsed = run(body)
    assert codes == [4403, 4403]
    assert elapsed < WITHIN_SECONDS


def test_a_member_who_leaves_loses_their_sockets_too(world, catalog):
    job = make_job(world.tenant)
    cookie = session_cookie(world.member, world.tenant)

    async def body():
        socket = await open_socket(f"/ws/jobs/{job.pk}/", cookie)
        await database_sync_to_async(remove)(world, world.member, by=world.member)
        code = await closed_code(socket)
        await socket.disconnect()
        return code

    assert run(body) == 4403


def test_someone_elses_removal_or_a_role_that_still_allows_watching_keeps_the_socket(
    world, catalog
):
    job = make_job(world.tenant)
    cookie = session_cookie(world.member, world.tenant)

    async def body():
        socket = await open_socket(f"/ws/jobs/{job.pk}/", cookie)
        await database_sync_to_async(remove)(world, world.finance, by=world.admin)
        await database_sync_to_async(change_role)(world, world.member, Role.VIEWER, by=world.admin)
        outputs = await outputs_for(socket, seconds=1.5)  # the re-checks have run
        await socket.disconnect()
        return [output["type"] for output in outputs]

    assert "websocket.close" not in run(body)


def test_a_role_change_below_viewing_closes_the_socket(world, catalog, monkeypatch):
    """Every role may view today; a role without the sockets' capability (here the viewer
    role, stripped of it for this test) must lose its sockets when someone is moved to it."""
    monkeypatch.setitem(ROLE_CAPABILITIES, Role.VIEWER, frozenset({Capability.USE_API_TOKENS}))
    job = make_job(world.tenant)
    cookie = session_cookie(world.member, world.tenant)

    async def body():
        job_socket = await open_socket(f"/ws/jobs/{job.pk}/", cookie)
        tenant_socket = await open_socket("/ws/tenant/", cookie)
        await database_sync_to_async(change_role)(world, world.member, Role.VIEWER, by=world.owner)
        codes = [await closed_code(job_socket), await closed_code(tenant_socket)]
        await job_socket.disconnect()
        await tenant_socket.disconnect()
        return codes

    assert run(body) == [4403, 4403]


def test_a_lost_notice_is_made_up_for_when_the_hub_resyncs(world, catalog, monkeypatch):
    """Redis lost the notice (an outage at commit): the hub's resync after a failed read
    makes every socket check again, and the removed member's socket still closes."""
    monkeypatch.setattr(realtime.publish, "send_to_group", lambda group, payload: None)
    job = make_job(world.tenant)
    cookie = session_cookie(world.member, world.tenant)

    async def body():
        socket = await open_socket(f"/ws/jobs/{job.pk}/", cookie)
        await database_sync_to_async(remove)(world, world.member, by=world.owner)
        assert "websocket.close" not in [o["type"] for o in await outputs_for(socket, seconds=0.5)]
        realtime.hub()._fan_out_all({"type": realtime.RESYNC})  # what a failed read does
        code = await closed_code(socket)
        await socket.disconnect()
        return code

    assert run(body) == 4403


def test_a_removed_member_cannot_open_a_new_socket(world, catalog):
    job = make_job(world.tenant)
    cookie = session_cookie(world.member, world.tenant)
    remove(world, world.member, by=world.owner)

    async def body():
        socket = communicator(f"/ws/jobs/{job.pk}/", cookie=cookie)
        connected, code = await socket.connect(timeout=TIMEOUT)
        await socket.disconnect()
        return connected, code

    assert run(body) == (False, 4403)


# --- invitations ---------------------------------------------------------------------------


def invite(world, by, email: str, role: str = Role.MEMBER) -> tuple[Invitation, str]:
    return invitation_create(
        tenant=world.tenant, by_membership=world.membership(by), email=email, role=role
    )


def test_removing_a_member_revokes_the_invitations_they_sent_that_are_pending(world):
    pending, _ = invite(world, world.admin, "new@example.test")
    used, used_raw = invite(world, world.admin, "used@example.test")
    invitation_accept(raw_token=used_raw, user=UserFactory(email="used@example.test"))
    by_owner, _ = invite(world, world.owner, "other@example.test")

    remove(world, world.admin, by=world.owner)

    pending.refresh_from_db()
    used.refresh_from_db()
    by_owner.refresh_from_db()
    assert pending.state == "revoked"
    assert used.state == "accepted" and used.revoked_at is None
    assert by_owner.state == "pending"
    event = AuditEvent.objects.get(action="invitation.revoked", target_id=str(pending.pk))
    assert event.actor == world.owner and event.tenant == world.tenant
    assert event.metadata == {"email": "new@example.test", "reason": "inviter no longer a member"}


def test_accepting_an_invitation_whose_sender_was_demoted_is_refused(world):
    invitation, raw = invite(world, world.admin, "late@example.test", role=Role.MEMBER)
    newcomer = UserFactory(email="late@example.test")
    change_role(world, world.admin, Role.MEMBER, by=world.owner)

    with pytest.raises(ServiceError) as refused:
        invitation_accept(raw_token=raw, user=newcomer)

    assert refused.value.code == "forbidden"
    assert "can no longer add members to Acme Corp as Member" in refused.value.message
    assert not Membership.objects.filter(user=newcomer).exists()
    invitation.refresh_from_db()
    assert invitation.accepted_at is None
    # The link's page says why, and a new account through it is refused the same way.
    page = signed_in_client(newcomer).get(f"/invitations/accept/{raw}/")
    assert page.status_code == 410 and "can no longer add members" in page.content.decode()
    with pytest.raises(ServiceError, match="can no longer add members"):
        signup_with_invitation(raw_token=raw, password="A-strong-pass-9931")


def test_an_invitation_stays_valid_while_its_sender_may_still_grant_the_role(world):
    """An owner's invitation to an admin stays good when the owner becomes an admin (admins
    may make admins), and fails once they can't grant it."""
    _, raw = invite(world, world.owner, "adm1@example.test", role=Role.ADMIN)
    _, raw2 = invite(world, world.owner, "adm2@example.test", role=Role.ADMIN)
    _, owner_raw = invite(world, world.owner, "own@example.test", role=Role.OWNER)
    # Demote the inviting owner (another owner first, so the tenant keeps one).
    change_role(world, world.admin, Role.OWNER, by=world.owner)
    change_role(world, world.owner, Role.ADMIN, by=world.admin)

    membership = invitation_accept(raw_token=raw, user=UserFactory(email="adm1@example.test"))
    assert membership.role == Role.ADMIN
    with pytest.raises(ServiceError, match="as Owner"):
        invitation_accept(raw_token=owner_raw, user=UserFactory(email="own@example.test"))
    change_role(world, world.owner, Role.FINANCE, by=world.admin)
    with pytest.raises(ServiceError, match="as Admin"):
        invitation_accept(raw_token=raw2, user=UserFactory(email="adm2@example.test"))
