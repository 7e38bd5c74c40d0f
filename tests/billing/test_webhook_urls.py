"""Budget webhook URLs: http(s) only, no credentials, and never an address only the server
can reach (loopback, private, link-local, reserved; nor an IPv6 address embedding one, in
any spelling) unless BUDGET_WEBHOOK_ALLOW_PRIVATE, checked when a budget is saved
(service, form, API) and again before each send.

No test here reaches the internet: public targets are literal public addresses that are
only validated, never posted to; the one real POST goes to a receiver on this host.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given
from hypothesis import strategies as st

from billing import webhooks
from billing.budgets import services
from billing.budgets.services import budget_create, budget_update
from billing.models import Budget
from billing.tasks import budget_webhook_task
from console.service_errors import ServiceError
from tests.conftest import signed_in_client, token_client

PUBLIC = "https://93.184.215.14/hooks/budget"  # a public address (never contacted)
REFUSED_ADDRESSES = [
    "http://127.0.0.1:8000/hook",
    "http://localhost/hook",  # a name that resolves to loopback
    "http://[::1]/hook",
    "http://10.1.2.3/hook",
    "http://172.16.0.9/hook",
    "http://192.168.1.10/hook",
    "http://169.254.169.254/latest/meta-data/",  # the cloud metadata endpoint
    "http://100.64.0.1/hook",  # carrier-grade NAT (shared address space)
    "http://0.0.0.0/hook",
    "http://[fe80::1]/hook",
    "http://[fd00::1]/hook",
    "http://240.0.0.1/hook",  # reserved
    "http://[::ffff:127.0.0.1]/hook",  # loopback written as IPv4-mapped IPv6
]
# IPv6 addresses that deliver to a refused IPv4 address, in several spellings each.
REFUSED_EMBEDDINGS = [
    "::ffff:7f00:1",  # IPv4-mapped loopback, in hex
    "0:0:0:0:0:ffff:127.0.0.1",
    "0000:0000:0000:0000:0000:FFFF:7F00:0001",
    "::FFFF:169.254.169.254",
    "::ffff:0:127.0.0.1",  # IPv4-translated (SIIT)
    "::ffff:0:a00:1",
    "::127.0.0.1",  # IPv4-compatible
    "::a9fe:a9fe",
    "0:0:0:0:0:0:10.1.2.3",
    "64:ff9b::127.0.0.1",  # NAT64 to loopback
    "64:ff9b::a9fe:a9fe",  # NAT64 to the metadata endpoint
    "64:FF9B:0:0:0:0:C0A8:010A",
    "64:ff9b:1::8.8.8.8",  # a network's own NAT64 (RFC 8215): never public
    "2002:7f00:1::",  # 6to4 around loopback
    "2002:a9fe:a9fe::1",  # 6to4 around the metadata endpoint
    "2002:0a00:0001:0:0:0:0:1",
]
REFUSED_FORMS = {
    "file:///etc/passwd": "http:// or https://",
    "gopher://93.184.215.14/x": "http:// or https://",
    "ftp://93.184.215.14/x": "http:// or https://",
    "https://user:secret@93.184.215.14/hook": "user name or password",
    "https://token@93.184.215.14/hook": "user name or password",
    "https:///hook": "no host",
    "http://93.184.215.14:99999/hook": "not a valid URL",
}


def create(world, url: str) -> Budget:
    return budget_create(
        tenant=world.tenant, user=world.owner, name="Cap", amount="10", webhook_url=url
    )


@pytest.mark.parametrize("url", REFUSED_ADDRESSES)
def test_internal_addresses_are_refused(world, catalog, url):
    with pytest.raises(ServiceError) as refused:
        create(world, url)
    assert refused.value.field == "webhook_url"
    assert "loopback, private, link-local or reserved" in refused.value.message
    assert not Budget.objects.exists()


@pytest.mark.parametrize("address", REFUSED_EMBEDDINGS)
def test_ipv6_addresses_embedding_a_refused_ipv4_address_are_refused(world, catalog, address):
    with pytest.raises(ServiceError) as refused:
        create(world, f"http://[{address}]:8080/hook")
    assert refused.value.field == "webhook_url"
    assert "loopback, private, link-local or reserved" in refused.value.message
    assert not Budget.objects.exists()


def test_a_name_resolving_to_a_nat64_address_of_the_metadata_endpoint_is_refused(
    world, catalog, monkeypatch
):
    def resolve(host, port, *args, **kwargs):
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("64:ff9b::a9fe:a9fe", port, 0, 0))]

    monkeypatch.setattr(webhooks.socket, "getaddrinfo", resolve)
    with pytest.raises(ServiceError, match="reserved"):
        create(world, "https://hooks.example.com/budget")


# IPv4 ranges the rule refuses, and the ways an IPv6 address embeds an IPv4 one.
REFUSED_IPV4_NETWORKS = [
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
        "172.16.0.0/12", "192.168.0.0/16", "198.18.0.0/15", "240.0.0.0/4",
    )
]  # fmt: skip
EMBEDDINGS = {
    "mapped": lambda v4, low: (0xFFFF << 32) | v4,
    "translated": lambda v4, low: (0xFFFF << 48) | v4,
    "compatible": lambda v4, low: v4,
    "nat64": lambda v4, low: (0x64FF9B << 96) | v4,
    "6to4": lambda v4, low: (0x2002 << 112) | (v4 << 80) | low,
}

refused_ipv4 = st.sampled_from(REFUSED_IPV4_NETWORKS).flatmap(
    lambda net: st.integers(0, net.num_addresses - 1).map(lambda i: net[i])
)
public_ipv4 = st.ip_addresses(v=4).filter(lambda a: a.is_global)


def spellings(address: ipaddress.IPv6Address) -> list[str]:
    """Ways to write one IPv6 address: shortest, full, upper case, IPv4 tail."""
    tail = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    head = address.exploded.rsplit(":", 2)[0]
    return [address.compressed, address.exploded, address.exploded.upper(), f"{head}:{tail}"]


@given(
    v4=refused_ipv4,
    how=st.sampled_from(sorted(EMBEDDINGS)),
    low=st.integers(0, 2**64 - 1),
)
def test_every_spelling_of_an_embedded_refused_ipv4_address_is_refused(v4, how, low):
    embedded = ipaddress.IPv6Address(EMBEDDINGS[how](int(v4), low))
    for spelling in spellings(embedded):
        with pytest.raises(ServiceError, match="reserved"):
            webhooks.webhook_url_validate(f"https://[{spelling}]/hook")


@given(v4=public_ipv4, how=st.sampled_from(["mapped", "nat64", "6to4"]), low=st.integers(1, 99))
def test_an_embedded_public_ipv4_address_is_judged_as_that_address(v4, how, low):
    embedded = ipaddress.IPv6Address(EMBEDDINGS[how](int(v4), low))
    assert webhooks.embedded_ipv4(embedded) == v4
    for spelling in spellings(embedded):
        url = f"https://[{spelling}]/hook"
        assert webhooks.webhook_url_validate(url) == url


@pytest.mark.parametrize("url", REFUSED_FORMS)
def test_other_schemes_credentials_and_malformed_urls_are_refused(world, catalog, url):
    with pytest.raises(ServiceError) as refused:
        create(world, url)
    assert refused.value.field == "webhook_url"
    assert REFUSED_FORMS[url] in refused.value.message


def test_a_public_address_and_no_webhook_are_accepted(world, catalog):
    budget = create(world, f"  {PUBLIC}  ")
    assert budget.webhook_url == PUBLIC
    budget_update(budget=budget, user=world.owner, webhook_url="")
    assert Budget.objects.get().webhook_url == ""


def test_a_name_resolving_to_any_internal_address_is_refused(world, catalog, monkeypatch):
    """One private address among public ones is enough to refuse (DNS can pick either)."""

    def resolve(host, port, *args, **kwargs):
        assert host == "hooks.example.com"
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port)),
        ]

    monkeypatch.setattr(webhooks.socket, "getaddrinfo", resolve)
    with pytest.raises(ServiceError, match="private"):
        create(world, "https://hooks.example.com/budget")


def test_an_unresolvable_host_is_refused(world, catalog, monkeypatch):
    def resolve(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(webhooks.socket, "getaddrinfo", resolve)
    with pytest.raises(ServiceError, match="can't be resolved"):
        create(world, "https://no-such-host.invalid/budget")


def test_update_checks_the_url_too(world, catalog):
    budget = create(world, PUBLIC)
    with pytest.raises(ServiceError) as refused:
        budget_update(budget=budget, user=world.owner, webhook_url="http://127.0.0.1/x")
    assert refused.value.field == "webhook_url"
    assert Budget.objects.get().webhook_url == PUBLIC


def test_the_setting_allows_internal_addresses_but_not_other_schemes(world, catalog, settings):
    settings.BUDGET_WEBHOOK_ALLOW_PRIVATE = True
    assert create(world, "http://127.0.0.1:8000/hook").webhook_url == "http://127.0.0.1:8000/hook"
    with pytest.raises(ServiceError, match="user name or password"):
        budget_update(
            budget=Budget.objects.get(), user=world.owner, webhook_url="http://a:b@127.0.0.1/"
        )
    with pytest.raises(ServiceError, match="http:// or https://"):
        budget_update(budget=Budget.objects.get(), user=world.owner, webhook_url="file:///x")


class Receiver(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.hits.append(self.path)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    Receiver.hits = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/budget?team=ml", Receiver.hits
    finally:
        server.shutdown()
        server.server_close()


def test_the_url_is_checked_again_at_send_time(world, catalog, settings, receiver):
    """Saved while allowed (or while its name resolved publicly): once the rule refuses
    it, nothing is sent, and the task drops it without retrying."""
    url, hits = receiver
    settings.BUDGET_WEBHOOK_ALLOW_PRIVATE = True
    budget = create(world, url)
    assert services.budget_webhook_send(budget=budget, payload={"n": 1}) == 204
    assert hits == ["/hooks/budget?team=ml"]

    settings.BUDGET_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(ServiceError, match="loopback"):
        services.budget_webhook_send(budget=budget, payload={"n": 2})
    budget_webhook_task.apply((budget.pk, {"n": 3})).get()  # logged, not raised, not retried
    assert hits == ["/hooks/budget?team=ml"]


def test_the_post_goes_to_the_address_that_was_checked(world, catalog, settings, monkeypatch):
    """The connection is made to the checked address, not to a second resolution."""
    settings.BUDGET_WEBHOOK_ALLOW_PRIVATE = False
    connected: list[tuple] = []

    def create_connection(address, timeout=None, *args, **kwargs):
        connected.append(address)
        raise ConnectionRefusedError("test: not really connecting")

    monkeypatch.setattr(webhooks.socket, "create_connection", create_connection)
    with pytest.raises(OSError):
        webhooks.webhook_post("http://93.184.215.14:8080/x", body=b"{}", headers={})
    assert connected == [("93.184.215.14", 8080)]


# --- the form and the API answer with clear errors ----


def test_the_budget_form_shows_the_error(world, catalog):
    client = signed_in_client(world.owner, world.tenant)
    response = client.post(
        "/billing/budgets/",
        {
            "name": "Cap",
            "amount": "100",
            "action": "alert_only",
            "thresholds": "50, 100",
            "webhook_url": "http://169.254.169.254/latest/meta-data/",
        },
    )
    assert response.status_code == 200
    assert "loopback, private, link-local or reserved" in response.content.decode()
    assert not Budget.objects.exists()


def test_the_api_answers_400_with_the_field(world, catalog):
    api = token_client(world.owner, world.tenant)
    body = {"name": "Cap", "amount": "100", "webhook_url": "http://10.0.0.5/hook"}
    response = api.post("/api/v1/budgets", body, format="json")
    assert response.status_code == 400
    assert "private" in response.json()["webhook_url"][0]
    assert not Budget.objects.exists()

    created = api.post("/api/v1/budgets", {**body, "webhook_url": PUBLIC}, format="json")
    assert created.status_code == 201, created.content
    patched = api.patch(
        f"/api/v1/budgets/{created.json()['id']}",
        {"webhook_url": "https://u:p@93.184.215.14/x"},
        format="json",
    )
    assert patched.status_code == 400
    assert "user name or password" in patched.json()["webhook_url"][0]
    assert Budget.objects.get().webhook_url == PUBLIC
