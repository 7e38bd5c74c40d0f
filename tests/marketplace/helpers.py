"""Helpers shared by the marketplace tests."""

from __future__ import annotations

from marketplace import demo


def demo_image_slugs(*, kind: str = "", vendor: str = "", query: str = "") -> set[str]:
    """Public demo images matching the filters, computed from the seed data itself (the
    demo catalog grows), so filter tests don't hard-code its contents."""
    found = set()
    for row in demo.IMAGES:
        # slug, name, reference, kind, cuda, rocm, framework, version, compatible, size,
        # description, default command, ports
        slug, name, image_kind, framework = row[0], row[1], row[3], row[6]
        compatible, description = row[8], row[10]
        if kind and image_kind != kind:
            continue
        if vendor and vendor not in compatible:
            continue
        if query and query.lower() not in f"{slug} {name} {framework} {description}".lower():
            continue
        found.add(slug)
    return found
