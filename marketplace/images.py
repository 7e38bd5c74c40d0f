"""Image references: parsed against the distribution reference grammar, so no arbitrary
string ever reaches a pod spec."""

from __future__ import annotations

import re
from dataclasses import dataclass

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[a-f0-9]{64}"
REFERENCE_RE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$"
)
DEFAULT_REGISTRY = "docker.io"


class InvalidReference(ValueError):
    pass


@dataclass(frozen=True)
class ImageReference:
    registry: str
    path: str
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        text = f"{self.registry}/{self.path}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_reference(text: str) -> ImageReference:
    text = (text or "").strip()
    if len(text) > 400:
        raise InvalidReference("An image reference is at most 400 characters.")
    match = REFERENCE_RE.match(text)
    if not match:
        raise InvalidReference(
            "Not a valid image reference; use registry/repository:tag or "
            "registry/repository@sha256:<64 hex digits>."
        )
    domain, path = match["domain"], match["path"]
    # Like Docker: the first part is a registry only if it looks like a host.
    if domain and not ("." in domain or ":" in domain or domain == "localhost"):
        if not re.fullmatch(_PATH_COMPONENT, domain):
            raise InvalidReference("Repository names are lower-case.")
        path, domain = f"{domain}/{path}", None
    if not (match["tag"] or match["digest"]):
        raise InvalidReference(
            "Pin the image by tag or digest (e.g. :2.4.0 or @sha256:…); "
            "an implicit :latest is refused."
        )
    return ImageReference(
        registry=(domain or DEFAULT_REGISTRY).lower(),
        path=path,
        tag=match["tag"],
        digest=match["digest"],
    )


def is_allowed(reference: ImageReference, allowed: list[tuple[str, str]]) -> bool:
    """`allowed` holds (host, path prefix) pairs; an empty prefix allows the whole host."""
    for host, prefix in allowed:
        if reference.registry != host.lower():
            continue
        prefix = prefix.strip("/")
        if not prefix or reference.path == prefix or reference.path.startswith(prefix + "/"):
            return True
    return False
