"""Static files: hashed names, pre-compressed, cached immutably; Plotly's smaller bundle."""

from __future__ import annotations

import ast
import gzip
import json
import re
import time
from pathlib import Path

import brotli
import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import Client, override_settings
from plotly.offline import get_plotlyjs_version

ROOT = Path(settings.BASE_DIR)
# Trace types in plotly.js-basic-dist (its README): what the Makefile vendors.
PLOTLY_BASIC_TRACES = {"scatter", "bar", "pie"}
CHART_MODULES = ["billing/charts.py", "billing/finance/charts.py", "jobs/metrics.py"]


def _static_urls(page: str) -> list[str]:
    return re.findall(r'(?:src|href)="(/static/[^"]+)"', page)


@pytest.fixture
def login_page_assets(db) -> list[str]:
    page = Client().get("/accounts/login/").content.decode()
    urls = _static_urls(page)
    assert urls, "the base layout names its CSS and JS"
    return urls


def test_pages_name_hashed_static_files(login_page_assets):
    for url in login_page_assets:
        assert re.search(r"\.[0-9a-f]{12}\.\w+$", url), url


def test_hashed_file_is_cached_for_a_year_and_immutable(login_page_assets):
    htmx_url = next(url for url in login_page_assets if "/vendor/htmx.min." in url)
    response = Client().get(htmx_url)
    assert response.status_code == 200
    cache_control = response.headers["Cache-Control"]
    assert "immutable" in cache_control
    max_age = int(re.search(r"max-age=(\d+)", cache_control).group(1))
    assert max_age >= 365 * 24 * 3600


@pytest.mark.parametrize("accept", ["br, gzip", "gzip"])
def test_compressed_when_the_browser_accepts_it(login_page_assets, accept):
    js_url = next(url for url in login_page_assets if "/js/app." in url)
    response = Client().get(js_url, HTTP_ACCEPT_ENCODING=accept)
    expected = "br" if "br" in accept else "gzip"
    assert response.headers["Content-Encoding"] == expected
    assert "Accept-Encoding" in response.headers["Vary"]
    body = b"".join(response.streaming_content)
    plain = gzip.decompress(body) if expected == "gzip" else brotli.decompress(body)
    assert plain == (ROOT / "static" / "js" / "app.js").read_bytes()


def test_uncompressed_without_accept_encoding(login_page_assets):
    css_url = next(url for url in login_page_assets if "/css/app." in url)
    response = Client().get(css_url)
    assert "Content-Encoding" not in response.headers
    assert b"".join(response.streaming_content) == (ROOT / "static/css/app.css").read_bytes()


def test_plotly_bundle_is_the_basic_one_at_the_wheels_version():
    """The figures are built by plotly.py, so plotly.js must be the version it targets."""
    pinned = json.loads((ROOT / "package.json").read_text())["dependencies"]
    assert pinned["plotly.js-basic-dist-min"] == get_plotlyjs_version()
    assert (
        "cp node_modules/plotly.js-basic-dist-min/plotly-basic.min.js"
        in (ROOT / "Makefile").read_text()
    )


def test_every_chart_trace_type_is_in_the_basic_bundle():
    used: set[str] = set()
    for module in CHART_MODULES:
        tree = ast.parse((ROOT / module).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict):
                continue
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if "type" in keys and keys & {"x", "y", "values", "labels"}:
                value = node.values[[getattr(k, "value", None) for k in node.keys].index("type")]
                assert isinstance(value, ast.Constant), f"{module}: computed trace type"
                used.add(value.value)
    assert used, "the chart modules build traces"
    assert used <= PLOTLY_BASIC_TRACES, used - PLOTLY_BASIC_TRACES


def test_collectstatic_compresses_a_file_once_and_again_when_it_changes(tmp_path):
    """console/static_storage.py: a second collectstatic keeps what it compressed; a
    changed file is compressed again, under its new hashed name and its plain one."""
    source, root = tmp_path / "source", tmp_path / "root"
    (source / "js").mkdir(parents=True)
    script = source / "js" / "page.js"
    script.write_text("console.log('first');\n" * 200)
    with override_settings(
        STATIC_ROOT=str(root),
        STATICFILES_DIRS=[str(source)],
        STATICFILES_FINDERS=["django.contrib.staticfiles.finders.FileSystemFinder"],
    ):
        collect = lambda: call_command("collectstatic", interactive=False, verbosity=0)  # noqa: E731
        collect()
        (first,) = [p for p in (root / "js").glob("page.*.js.br")]
        compressed_at = {p: p.stat().st_mtime_ns for p in (root / "js").glob("*.br")}
        collect()
        assert {p: p.stat().st_mtime_ns for p in (root / "js").glob("*.br")} == compressed_at

        time.sleep(1.1)  # collectstatic copies a file changed in a later second only
        script.write_text("console.log('second');\n" * 200)
        collect()
        plain = brotli.decompress((root / "js" / "page.js.br").read_bytes())
        assert plain == script.read_bytes()
        hashed = [p for p in (root / "js").glob("page.*.js.br") if p != first]
        assert [brotli.decompress(p.read_bytes()) for p in hashed] == [script.read_bytes()]


@pytest.mark.django_db
def test_plain_names_the_error_pages_use_are_served():
    page = (ROOT / "templates" / "errors" / "404.html").read_text()
    for url in _static_urls(page):
        assert Client().get(url).status_code == 200, url
