"""The launch page's dependent fields (jobs:launch_options, htmx), its prefill from a
"Launch this" link (an offer's, an estimate's), the volume region warning, and who may
use them."""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlparse

import pytest
from django.urls import reverse

from jobs.models import Job
from tests.conftest import signed_in_client
from tests.factories import ImageFactory, VolumeFactory

LAUNCH = reverse("jobs:launch")
OPTIONS = reverse("jobs:launch_options")
ESTIMATE = reverse("marketplace:estimate")


@pytest.fixture
def member(world, catalog, settings):
    settings.COMPUTE_BACKENDS = ["local", "kubernetes"]
    return signed_in_client(world.member, world.tenant)


def selected(html: str, select_id: str) -> str | None:
    """The value of the selected option of the <select id=…> in `html`."""
    block = re.search(rf'<select[^>]*id="{select_id}"[^>]*>(.*?)</select>', html, re.S)
    assert block, f"no select {select_id}"
    chosen = re.search(r'<option value="([^"]*)" selected>', block.group(1))
    return chosen.group(1) if chosen else None


def options(html: str, select_id: str) -> list[str]:
    block = re.search(rf'<select[^>]*id="{select_id}"[^>]*>(.*?)</select>', html, re.S)
    assert block, f"no select {select_id}"
    return re.findall(r'<option value="([^"]*)"', block.group(1))


def notes(html: str) -> str:
    found = re.search(r'data-testid="launch-notes"><ul>(.*?)</ul>', html, re.S)
    return re.sub(r"<[^>]+>", " ", found.group(1)) if found else ""


# --- htmx: the dependent fields follow ---------------------------------------------------


def test_choosing_a_gpu_type_updates_region_gpus_image_and_capacity(member):
    response = member.get(
        OPTIONS,
        {"gpu_type": "a100-80gb", "region": "local", "gpus_per_node": "0", "nodes": "1",
         "spot_ratio": "0", "image": "python-3.11", "cpus": "1", "changed": "gpu_type"},
        HTTP_HX_REQUEST="true",
    )  # fmt: skip
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html
    assert html.lstrip().startswith('<div id="launch-capacity"')
    assert (
        '<select name="region" id="id_region" data-launch-choice hx-swap-oob="outerHTML">' in html
    )
    assert set(options(html, "id_region")) == {"us-west", "eu-central"}
    assert selected(html, "id_region") == "us-west"
    assert options(html, "id_gpus_per_node") == [str(n) for n in range(1, 9)]
    assert selected(html, "id_gpus_per_node") == "8"  # a whole node, never 0
    image = selected(html, "id_image")
    assert image not in (None, "python-3.11")
    assert 'id="id_spot_ratio"' not in html  # the ratio asked stands: nothing to replace
    assert (
        "On-demand: <strong>32 of 32 GPUs free</strong> (4 nodes × 8 GPUs); this job takes 8."
        in html
    )
    assert "No queued job ahead of it. It can start now." in html
    # The region changed without being asked for: the page says why.
    assert "A100 80GB SXM is not offered in This host: US West (Oregon) chosen." in notes(html)
    # The live estimate refreshes once the new choices are in the form.
    assert json.loads(response["HX-Trigger-After-Settle"]) == {"launch-choices-changed": {}}


def test_the_field_being_edited_is_not_replaced(member):
    response = member.get(
        OPTIONS,
        {"gpu_type": "a100-80gb", "region": "eu-central", "gpus_per_node": "8",
         "spot_ratio": "0.2", "changed": "spot_ratio"},
        HTTP_HX_REQUEST="true",
    )  # fmt: skip
    html = response.content.decode()
    assert 'id="id_spot_ratio"' not in html  # its own value stays as typed
    # Changing the region to one with spot only sets the ratio (the input is replaced).
    html = member.get(
        OPTIONS,
        {"gpu_type": "a100-80gb", "region": "eu-central", "spot_ratio": "0", "changed": "region"},
        HTTP_HX_REQUEST="true",
    ).content.decode()
    spot = re.search(r'<input type="number" name="spot_ratio"[^>]*>', html)
    assert spot and 'value="1"' in spot.group(0) and 'hx-swap-oob="outerHTML"' in spot.group(0)
    assert "spot only: spot ratio set to 1" in notes(html)
    assert "1 node: spot" in html


def test_a_volume_in_another_region_is_warned_about_and_refused(member, world):
    VolumeFactory(tenant=world.tenant, name="data", region__slug="eu-central")
    params = {"gpu_type": "a100-80gb", "region": "us-west", "gpus_per_node": "8",
              "volumes": "data:/data"}  # fmt: skip
    html = member.get(OPTIONS, params, HTTP_HX_REQUEST="true").content.decode()
    warning = re.search(r'<small id="launch-volume-note"[^>]*>(.*?)</small>', html, re.S)
    assert warning and 'role="alert"' in warning.group(0)
    assert warning.group(1) == (
        "Volume data is in eu-central; this job runs in us-west. A volume is only usable "
        "in its region."
    )
    # In its region: no warning.
    html = member.get(OPTIONS, {**params, "region": "eu-central"}, HTTP_HX_REQUEST="true")
    assert re.search(r'<small id="launch-volume-note"[^>]*hidden', html.content.decode())

    # The full page warns too, and a submit is refused on the field.
    page = member.get(LAUNCH, {"gpu_type": "a100-80gb", "region": "us-west"}).content.decode()
    assert 'id="launch-volume-note"' in page
    response = member.post(
        LAUNCH,
        {"name": "x", "gpu_type": "a100-80gb", "gpus_per_node": "8", "cpus": "8", "nodes": "1",
         "region": "us-west", "spot_ratio": "0", "image": "cuda-12-4-runtime",
         "command": "python train.py", "priority": "normal", "max_runtime_minutes": "60",
         "volumes": "data:/data"},
    )  # fmt: skip
    assert response.status_code == 200
    assert "Volume data is in eu-central" in response.context["form"].errors["volumes"][0]
    assert "Volume data is in eu-central; this job runs in us-west" in response.content.decode()
    assert not Job.objects.exists()


def test_options_are_the_tenants_own(member, world, other_world):
    ImageFactory(tenant=other_world.tenant, slug="theirs", compatible_with=["cpu"])
    VolumeFactory(tenant=other_world.tenant, name="theirs", region__slug="local")
    html = member.get(
        OPTIONS, {"region": "local", "volumes": "theirs:/data"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert 'value="theirs"' not in html
    assert "No volume named theirs." in html  # another tenant's volume isn't one of ours


def test_who_may_see_the_options(world, catalog):
    viewer = signed_in_client(world.viewer, world.tenant)
    assert viewer.get(OPTIONS, HTTP_HX_REQUEST="true").status_code == 403
    anonymous = signed_in_client(world.member).__class__()
    response = anonymous.get(OPTIONS)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


# --- prefill from a link ---------------------------------------------------------------------


def test_a_launch_link_prefills_the_form(member):
    response = member.get(
        LAUNCH,
        {"gpu_type": "a100-80gb", "region": "us-west", "tier": "spot", "gpus_per_node": "4",
         "count": "2", "hours": "1.5"},
    )  # fmt: skip
    assert response.status_code == 200
    html = response.content.decode()
    form = response.context["form"]
    assert (form.initial["gpu_type"], form.initial["region"]) == ("a100-80gb", "us-west")
    assert (form.initial["gpus_per_node"], form.initial["nodes"]) == (4, 2)
    assert form.initial["spot_ratio"] == 1 and form.initial["max_runtime_minutes"] == 90
    assert selected(html, "id_gpu_type") == "a100-80gb"
    assert selected(html, "id_region") == "us-west"
    assert selected(html, "id_gpus_per_node") == "4"
    assert re.search(r'<input type="number" name="spot_ratio"[^>]*value="1"', html)
    assert 'name="nodes" value="2"' in html
    assert "2 nodes: spot" in html
    assert notes(html) == ""


def test_a_link_with_bad_values_ignores_them_and_says_so(member):
    response = member.get(
        LAUNCH,
        {"gpu_type": "nope", "region": "mars", "tier": "cheap", "count": "zero",
         "spot_ratio": "2", "gpus_per_node": "99", "hours": "-1", "image": "<b>x</b>"},
    )  # fmt: skip
    assert response.status_code == 200
    said = notes(response.content.decode())
    for note in (
        "Ignored tier=cheap: launches are on_demand or spot.",
        "Ignored spot_ratio=2: a spot ratio is from 0 to 1.",
        "Ignored count=zero: the node count is a whole number from 1 to 1024.",
        "Ignored gpus_per_node=99: GPUs per node is a whole number from 1 to 64.",
        "Ignored hours=-1: the maximum runtime is up to 90 days.",
        "“nope” is not offered for launch here.",
        "CPU is not offered in “mars”: US West (Oregon) chosen.",
        "“&lt;b&gt;x&lt;/b&gt;” doesn&#x27;t run on CPU: Python 3.11 (CPU) chosen.",
    ):
        assert note in said, (note, said)
    assert "<b>x</b>" not in response.content.decode()


def test_a_link_to_what_does_not_exist_here_says_what_it_chose(member):
    html = member.get(LAUNCH, {"gpu_type": "l4", "region": "us-west"}).content.decode()
    assert "L4 24GB is not offered in US West (Oregon): US East (Virginia) chosen." in notes(html)
    assert selected(html, "id_region") == "us-east"
    assert selected(html, "id_gpus_per_node") == "4"


# --- the estimate's "Launch this" --------------------------------------------------------------


def test_the_estimate_links_to_the_launch_form_with_its_choices(member):
    estimate = {"gpu_type": "a100-80gb", "gpus_per_node": "8", "nodes": "3", "region": "us-west",
                "spot_ratio": "0.7", "tier": "on_demand", "hours": "24"}  # fmt: skip
    html = member.get(ESTIMATE, estimate, HTTP_HX_REQUEST="true").content.decode()
    link = re.search(r'<a class="btn btn-primary" href="([^"]+)" data-testid="estimate-launch">'
                     r"Launch this</a>", html)  # fmt: skip
    assert link
    url = urlparse(link.group(1).replace("&amp;", "&"))
    assert url.path == LAUNCH
    assert {k: v[0] for k, v in parse_qs(url.query).items()} == {
        "gpu_type": "a100-80gb", "region": "us-west", "nodes": "3", "spot_ratio": "0.7",
        "hours": "24", "gpus_per_node": "8",
    }  # fmt: skip
    page = member.get(link.group(1).replace("&amp;", "&")).content.decode()
    assert "2 spot + 1 on-demand nodes" in page and notes(page) == ""
    # Not on the launch form's own estimate, nor for a member who can't launch.
    own = member.get(ESTIMATE, {**estimate, "in_launch_form": "1"}, HTTP_HX_REQUEST="true")
    assert "estimate-launch" not in own.content.decode()


def test_the_estimate_offers_no_launch_to_a_viewer(world, catalog):
    viewer = signed_in_client(world.viewer, world.tenant)
    html = viewer.get(
        ESTIMATE,
        {"gpu_type": "a100-80gb", "gpus_per_node": "8", "nodes": "1", "region": "us-west",
         "spot_ratio": "0", "tier": "on_demand", "hours": "1"},
        HTTP_HX_REQUEST="true",
    ).content.decode()  # fmt: skip
    assert 'data-testid="estimate-hourly"' in html and "estimate-launch" not in html
