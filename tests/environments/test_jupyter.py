"""Jupyter through the console, for real: Debian's jupyter-server (with the classic
notebook UI and an IPython kernel) running as an environment's job in the host sandbox
on the local backend, reached through the console's own web server (uvicorn, its own
process) at /env/<organisation>/<environment>/ with the member's console session only:
pages, the REST API and a kernel's WebSocket running a cell; nobody else gets through.

Where the host sandbox can't run these skip, saying so, except in CI (which installs it)."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from datetime import timedelta

import httpx
import pytest
import websockets
from django.conf import settings
from django.http import HttpResponse
from django.utils import timezone
from websockets.sync.client import connect

from environments import jupyter, proxy, selectors, services
from environments.models import EnvironmentStatus
from environments.services.lifecycle import idle_policy_validate
from jobs.backends import get_backend
from jobs.backends.local_sandbox import sandbox_support
from tests.conftest import signed_in_client
from tests.environments.conftest import wait_for_environment
from tests.servers import asgi_server  # noqa: F401  (fixture)

if not sandbox_support().network and not os.environ.get("CI"):
    pytest.skip(
        f"no host sandbox with network here: {sandbox_support().summary}", allow_module_level=True
    )
if not shutil.which("jupyter-nbclassic") and not os.environ.get("CI"):
    pytest.skip("Debian's python3-nbclassic is missing (make setup installs it)",
                allow_module_level=True)  # fmt: skip

pytestmark = pytest.mark.django_db(transaction=True)
BASE = "/env/acme/lab/"


def session_cookie(user, tenant) -> dict[str, str]:
    client = signed_in_client(user, tenant)
    return {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}


@pytest.fixture
def lab(world, catalog, tasks_in_process, asgi_server):  # noqa: F811
    environment = services.environment_create(
        tenant=world.tenant, user=world.member, name="lab", region="local",
        image="python-3.11", cpus=1, interactive="both",
    )  # fmt: skip
    services.environment_start(environment=environment, user=world.member)
    environment = wait_for_environment(environment, {EnvironmentStatus.RUNNING})
    member = httpx.Client(
        base_url=asgi_server.url, cookies=session_cookie(world.member, world.tenant), timeout=30
    )
    deadline = time.monotonic() + 60
    while (answer := member.get(f"{BASE}api/status")).status_code != 200:
        assert answer.status_code in (503, 502), asgi_server.log()[-3000:]
        if time.monotonic() > deadline:
            job = environment.current_job
            log = "\n".join(line.text for line in get_backend(job.backend).logs(job))
            raise AssertionError(f"Jupyter never answered: {answer.text[-500:]}\n{log}")
        time.sleep(0.5)
    # Both: sshd runs beside Jupyter (its port published for the SSH gateway too).
    assert selectors.environment_port_address(environment=environment) is not None
    yield environment, member
    member.close()


def kernel_socket(ws_url: str, cookies: dict[str, str], origin: str):
    header = "; ".join(f"{k}={v}" for k, v in cookies.items())
    return connect(ws_url, additional_headers={"Cookie": header}, origin=origin, open_timeout=20)


def run_cell(ws_url: str, cookies: dict[str, str], origin: str, code: str) -> str:
    """Execute `code` on a kernel over its WebSocket (Jupyter's messaging protocol);
    what it printed."""
    with kernel_socket(ws_url, cookies, origin) as socket:
        msg_id = uuid.uuid4().hex
        socket.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                       "session": uuid.uuid4().hex, "version": "5.3",
                       "date": timezone.now().isoformat()},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))  # fmt: skip
        printed = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = json.loads(socket.recv(timeout=deadline - time.monotonic()))
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "stream":
                printed.append(message["content"]["text"])
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                return "".join(printed)
    raise AssertionError("the kernel never answered")


def test_a_member_opens_jupyter_without_a_token_and_runs_a_cell(lab, world, asgi_server):  # noqa: F811
    _, member = lab
    tree = member.get(f"{BASE}tree")
    assert tree.status_code == 200 and "Jupyter" in tree.text
    # The console's session stays with the console: Jupyter never sees the cookie.
    assert settings.SESSION_COOKIE_NAME not in tree.headers.get("set-cookie", "")

    origin = {"Origin": asgi_server.url}
    saved = member.put(
        f"{BASE}api/contents/hello.txt",
        json={"type": "file", "format": "text", "content": "kept on the home volume\n"},
        headers=origin,
    )
    assert saved.status_code in (200, 201), saved.text
    kernel = member.post(f"{BASE}api/kernels", json={"name": "python3"}, headers=origin)
    assert kernel.status_code == 201, kernel.text
    kernel_id = kernel.json()["id"]

    cookies = dict(member.cookies)
    ws_url = f"{asgi_server.ws_url}{BASE}api/kernels/{kernel_id}/channels"
    code = "import os; print(open('/workspace/hello.txt').read().strip(), os.getcwd(), 6 * 7)"
    printed = run_cell(ws_url, cookies, asgi_server.url, code)
    assert printed == "kept on the home volume /workspace 42\n"

    # A cross-site change is refused before it reaches Jupyter.
    forged = member.post(
        f"{BASE}api/kernels", json={"name": "python3"}, headers={"Origin": "https://evil.test"}
    )
    assert forged.status_code == 403
    assert len(member.get(f"{BASE}api/kernels").json()) == 1


def test_nobody_else_gets_through(lab, world, other_world, asgi_server):  # noqa: F811
    environment, member = lab
    with httpx.Client(base_url=asgi_server.url, timeout=30) as anonymous:
        signed_out = anonymous.get(f"{BASE}tree")
        assert (
            signed_out.status_code == 302 and "/accounts/login/" in signed_out.headers["location"]
        )
        # Jupyter's own token is no way in through the console either.
        token = jupyter.jupyter_token(environment)
        assert anonymous.get(f"{BASE}api/status?token={token}").status_code == 302
    outsider = httpx.Client(
        base_url=asgi_server.url,
        cookies=session_cookie(other_world.owner, other_world.tenant),
        timeout=30,
    )
    with outsider:
        assert outsider.get(f"{BASE}tree").status_code == 404
        assert outsider.get("/env/acme/missing/tree").status_code == 404
    # An admin may start, stop and SSH into it, but opens no page another person's job
    # serves (environments.selectors.may_open_jupyter).
    admin_cookies = session_cookie(world.admin, world.tenant)
    with httpx.Client(base_url=asgi_server.url, cookies=admin_cookies, timeout=30) as admin:
        assert admin.get(f"{BASE}tree").status_code == 404
    kernel_id = member.post(
        f"{BASE}api/kernels", json={"name": "python3"}, headers={"Origin": asgi_server.url}
    ).json()["id"]
    ws_url = f"{asgi_server.ws_url}{BASE}api/kernels/{kernel_id}/channels"
    their_cookies = session_cookie(other_world.owner, other_world.tenant)
    with pytest.raises(websockets.InvalidStatus):
        run_cell(ws_url, their_cookies, asgi_server.url, "print(1)")


def test_an_open_kernel_is_activity_and_a_quiet_server_is_idle_since_its_last_use(
    lab,
    world,
    asgi_server,  # noqa: F811
):
    environment, member = lab
    environment.refresh_from_db()
    policy = idle_policy_validate(environment.idle_policy)

    def reading():
        sources = selectors.environment_activities(
            environment=environment, policy=policy, now=timezone.now()
        )
        return next(s for s in sources if s.source == "jupyter")

    quiet = reading()
    assert "none busy or connected" in quiet.detail
    assert quiet.last_active_at is not None and quiet.last_active_at <= timezone.now()

    started = member.post(
        f"{BASE}api/kernels", json={"name": "python3"}, headers={"Origin": asgi_server.url}
    )
    assert started.status_code == 201
    ws_url = f"{asgi_server.ws_url}{BASE}api/kernels/{started.json()['id']}/channels"
    with kernel_socket(ws_url, dict(member.cookies), asgi_server.url):
        deadline = time.monotonic() + 10
        while "1 connection(s)" not in (open_reading := reading()).detail:
            assert time.monotonic() < deadline, open_reading
            time.sleep(0.2)
        assert open_reading.last_active_at is not None
        assert timezone.now() - open_reading.last_active_at < timedelta(seconds=5)

    # Closed: quiet again, idle from its last use on.
    assert "none busy or connected" in wait_quiet(reading).detail


def wait_quiet(reading, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while "none busy or connected" not in (current := reading()).detail:
        assert time.monotonic() < deadline, current
        time.sleep(0.2)
    return current


def test_only_jupyter_s_own_cookies_come_back_and_only_on_its_path(world, catalog):
    environment = services.environment_create(
        tenant=world.tenant, user=world.member, name="lab", region="local",
        image="python-3.11", cpus=1, interactive="jupyter",
    )  # fmt: skip
    response = HttpResponse()
    for header in (
        "sessionid=stolen; Path=/; HttpOnly",
        "csrftoken=forged; Path=/",
        "_xsrf=2|abc; Path=/; Domain=127.0.0.1",
        "username-127-0-0-1-8888=x; Path=/env/acme/lab/",
    ):
        proxy._pass_cookie(response, header, jupyter.base_path(environment))
    assert sorted(response.cookies) == ["_xsrf", "username-127-0-0-1-8888"]
    assert {m["path"] for m in response.cookies.values()} == {BASE}
    assert response.cookies["_xsrf"]["domain"] == ""
