"""Outbound budget webhooks: which URLs a tenant may set, and the POST itself.

A webhook URL is typed by a tenant admin and fetched by our server, so it must not reach
what only the server can reach (SSRF: the cloud metadata endpoint, our Postgres, Redis or
the cluster's control plane). Rules, checked when a budget is saved and again at each
send (the name may resolve elsewhere by then):

- http or https only, no user name or password in the URL;
- every address the host resolves to is a public one (`ipaddress`'s `is_global`, which
  refuses loopback, private, link-local, shared, reserved and unspecified ranges), unless
  `settings.BUDGET_WEBHOOK_ALLOW_PRIVATE` is on;
- an IPv6 address that carries an IPv4 address (IPv4-mapped, -translated or -compatible,
  NAT64, 6to4) reaches that IPv4 address through a translator or tunnel, however it is
  spelled, so the IPv4 address it embeds must be public too.

The POST connects to the very address that was checked (with the URL's host name for the
Host header and TLS), so a name that re-resolves between check and connect can't redirect
it; redirects are not followed.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from urllib.parse import urlsplit

from django.conf import settings

from console.service_errors import ServiceError

FIELD = "webhook_url"
SCHEMES = {"http": 80, "https": 443}
# IPv6 prefixes whose last 32 bits are an IPv4 address that packets are delivered to.
IPV4_IN_LAST_32_BITS = tuple(
    ipaddress.IPv6Network(prefix)
    for prefix in (
        "::ffff:0:0/96",  # IPv4-mapped
        "::ffff:0:0:0/96",  # IPv4-translated (SIIT, RFC 2765)
        "::/96",  # IPv4-compatible (deprecated; :: and ::1 embed 0.0.0.0 and 0.0.0.1)
        "64:ff9b::/96",  # NAT64's well-known prefix (RFC 6052)
    )
)
# NAT64's prefix for a network's own translator (RFC 8215): local by definition, though
# `is_global` (Python 3.11) doesn't know it.
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")


def _refuse(message: str) -> ServiceError:
    return ServiceError(message, field=FIELD)


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address delivers to, if it embeds one (6to4 in bits
    16-47, the others in the last 32 bits)."""
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in prefix for prefix in IPV4_IN_LAST_32_BITS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a webhook may be sent to `address`: a public one, embedding (if IPv6) no
    IPv4 address that isn't."""
    if not address.is_global:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        if address in LOCAL_NAT64:
            return False
        embedded = embedded_ipv4(address)
        if embedded is not None:
            return address_is_public(embedded)
    return True


def webhook_url_validate(url: str) -> str:
    """The URL, stripped, if it is an acceptable webhook target; ServiceError otherwise.
    An empty URL (no webhook) is acceptable."""
    url = (url or "").strip()
    if url:
        _target(url)
    return url


def _target(url: str) -> tuple[str, int, str, list[str]]:
    """(scheme, port, host, addresses) of an acceptable URL: every address checked."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise _refuse("That is not a valid URL.") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise _refuse("Webhook URLs are http:// or https://.")
    if parts.username is not None or parts.password is not None:
        raise _refuse("Webhook URLs can't carry a user name or password; use the signature.")
    host = parts.hostname
    if not host:
        raise _refuse("The webhook URL has no host.")
    port = port or SCHEMES[scheme]
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise _refuse(f"The webhook host “{host}” can't be resolved.") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    if not settings.BUDGET_WEBHOOK_ALLOW_PRIVATE:
        for address in addresses:
            # "fe80::1%eth0": the zone doesn't change the address's kind.
            if not address_is_public(ipaddress.ip_address(address.split("%")[0])):
                raise _refuse(
                    f"The webhook host “{host}” is a loopback, private, link-local or "
                    "reserved address; use a public one."
                )
    return scheme, port, host, addresses


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to a checked address, whatever the host name resolves to now."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """The same over TLS: the certificate is checked against the URL's host name."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        self.tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self.tls)
        self.address = address

    def connect(self) -> None:
        raw = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(raw, server_hostname=self.host)


def webhook_post(url: str, *, body: bytes, headers: dict[str, str], timeout: float = 10) -> int:
    """POST `body` to an acceptable URL (checked again now); returns the HTTP status.
    Raises ServiceError for a refused URL, OSError for network failures (retried)."""
    scheme, port, host, addresses = _target(url.strip())
    parts = urlsplit(url.strip())
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    pinned = _PinnedHTTPSConnection if scheme == "https" else _PinnedHTTPConnection
    connection = pinned(host, port, addresses[0], timeout)
    try:
        connection.request("POST", path, body=body, headers=headers)
        return connection.getresponse().status
    finally:
        connection.close()
