"""Marketplace pages: offers (full page and htmx partial), live estimate, image catalog."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.contrib.messages import get_messages
from django.contrib.messages.storage.fallback import FallbackStorage
from django.urls import reverse

from billing import panels
from console.confirm import confirm_then_act
from console.service_errors import ServiceError
from marketplace import extensions, services
from marketplace.models import Image
from tests.conftest import signed_in_client

OFFERS = reverse("marketplace:offers")
ESTIMATE = reverse("marketplace:estimate")
IMAGES = reverse("marketplace:images")
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def member(catalog, world):
    return signed_in_client(world.member, world.tenant)


def test_pages_need_sign_in(catalog, client):
    for url in (OFFERS, ESTIMATE, IMAGES):
        response = client.get(url)
        assert response.status_code == 302
        assert "login" in response["Location"]


def test_offers_page_renders(member):
    response = member.get(OFFERS)

    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" in html
    assert 'id="offers-table"' in html
    assert 'data-offer="a100-80gb|us-west|on_demand"' in html
    assert 'data-testid="cpu-offers-table"' in html
    assert 'aria-label="Filter offers"' in html


def test_offers_htmx_request_returns_only_the_table(member):
    response = member.get(
        OFFERS, {"tier": "spot", "region": "us-west"}, HTTP_HX_TARGET="offers-table", **HTMX
    )

    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="offers-table"')
    assert "<html" not in html
    assert 'aria-label="Filter offers"' not in html
    assert 'data-offer="a100-80gb|us-west|spot"' in html
    assert "|on_demand" not in html
    assert "|us-east|" not in html


def test_offers_page_filters(member):
    html = member.get(OFFERS, {"vendor": "amd", "available": "on"}).content.decode()
    assert 'data-offer="mi300x|us-east|on_demand"' in html
    assert 'data-offer="mi300x|eu-central|spot"' in html
    assert 'data-offer="mi250|us-west' not in html  # no MI250 capacity in us-west
    assert "h100-80gb" not in html.split('id="offers-table"')[1].split("</section>")[0]


def test_offers_page_shows_the_tenant_discount(catalog, world, other_world):
    services.tenant_pricing_set(
        tenant=world.tenant, discount_percent=Decimal(10), note="", user=world.owner
    )
    params = {"region": "us-west", "tier": "on_demand"}
    ours = signed_in_client(world.member, world.tenant).get(OFFERS, params)
    theirs = signed_in_client(other_world.member, other_world.tenant).get(OFFERS, params)

    a100 = [g for g in ours.context["offer_table"].gpu_groups if g.label == "a100-80gb|us-west"]
    assert [o.unit_price for o in a100[0].offers] == [Decimal("1.611000")]
    a100 = [g for g in theirs.context["offer_table"].gpu_groups if g.label == "a100-80gb|us-west"]
    assert [o.unit_price for o in a100[0].offers] == [Decimal("1.790000")]


def test_offers_are_grouped_with_the_tiers_side_by_side_and_a_launch_link(member):
    html = member.get(OFFERS).content.decode()

    row = html.split('data-group="a100-80gb|us-west"')[1].split("</tr>")[0]
    for tier in ("on_demand", "spot", "reserved"):
        assert f'data-offer="a100-80gb|us-west|{tier}"' in row
    assert "Save 55 %" in row
    assert "1.7900 USD" in row  # the one money format: unit prices to 4 places
    assert (
        'href="/jobs/launch/?gpu_type=a100-80gb&amp;region=us-west&amp;tier=spot'
        '&amp;gpus_per_node=8"' in row
    )
    # Reserved is priced but not launched from here.
    reserved = row.split('data-offer="a100-80gb|us-west|reserved"')[1]
    assert "Launch this" not in reserved


def test_offers_page_ids_are_unique(member):
    """The filter's fields and the estimate's share names; their ids don't."""
    html = member.get(OFFERS).content.decode()
    ids = re.findall(r'\sid="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    assert 'id="filter-region"' in html and 'id="id_region"' in html
    assert '<label for="filter-tier">Tier</label>' in html


def test_offers_compact_toggle_is_kept_in_the_query_string(member):
    normal = member.get(OFFERS, {"region": "us-west"})
    compact = member.get(OFFERS, {"region": "us-west", "compact": "on"})

    assert normal.context["compact"] is False and compact.context["compact"] is True
    assert 'data-compact="off"' in normal.content.decode()
    html = compact.content.decode()
    assert 'data-compact="on"' in html
    assert 'name="compact" id="filter-compact" checked' in html
    # The same groups, shorter: no per-PFLOP prices or architecture lines.
    assert "USD per PFLOP-hour" in normal.content.decode()
    assert "USD per PFLOP-hour" not in html
    groups = compact.context["offer_table"].gpu_groups
    assert [g.label for g in groups] == [g.label for g in normal.context["offer_table"].gpu_groups]
    partial = member.get(
        OFFERS, {"compact": "on"}, HTTP_HX_TARGET="offers-table", **HTMX
    ).content.decode()
    assert 'data-compact="on"' in partial


def test_offers_page_filters_by_gpu_type_and_tier(member):
    response = member.get(OFFERS, {"gpu_type": "h100-80gb", "tier": "on_demand"})

    table = response.context["offer_table"]
    assert table.tiers == ["on_demand"]
    assert table.gpu_groups and {g.gpu_type.slug for g in table.gpu_groups} == {"h100-80gb"}
    html = response.content.decode()
    assert "|spot" not in html and "a100-80gb|" not in html


def test_offers_page_empty_state(member):
    response = member.get(OFFERS, {"min_memory_gib": 100000, "available": "on"})

    html = response.content.decode()
    assert 'data-testid="offers-empty"' in html
    assert 'data-testid="offers-table"' not in html


def test_offers_page_says_what_is_wrong_with_a_filter(member):
    response = member.get(OFFERS, {"gpu_type": "no-such-gpu"})

    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-testid="filter-errors"' in html
    assert "GPU type: Select a valid choice." in html


def test_offers_page_query_count_is_bounded(member, django_assert_max_num_queries):
    member.get(OFFERS)
    with django_assert_max_num_queries(20):
        member.get(OFFERS)


def test_estimate_partial_shows_the_seed_example(member):
    response = member.get(
        ESTIMATE,
        {
            "gpu_type": "a100-80gb",
            "gpus_per_node": 8,
            "nodes": 1,
            "region": "us-west",
            "tier": "on_demand",
            "spot_ratio": "0.7",
            "hours": "24",
        },
        **HTMX,
    )

    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html
    # One node can't be 70 % spot: the form says so, and prices the node on spot as the
    # launch places it (8 × 0.8055 = 6.444 an hour; × 24 = 154.656).
    assert 'data-testid="estimate-split"><strong>1 node: spot</strong>' in html
    assert "A spot ratio of 70 % can&#x27;t be honoured with 1 node" in html
    assert 'data-testid="estimate-hourly">6.44 USD' in html
    assert "154.66 USD" in html
    assert "spot 0.8055 USD, other 1.7900 USD per GPU-hour" in html


def test_estimate_partial_shows_a_mixed_split_with_thousands_grouped(member):
    response = member.get(
        ESTIMATE,
        {
            "gpu_type": "a100-80gb",
            "gpus_per_node": 8,
            "nodes": 10,
            "region": "us-west",
            "tier": "on_demand",
            "spot_ratio": "0.7",
            "hours": "24",
        },
        **HTMX,
    )
    html = response.content.decode()
    assert "<strong>7 spot + 3 on-demand nodes</strong>" in html
    assert "estimate-split-note" not in html
    assert 'data-testid="estimate-hourly">88.07 USD' in html
    assert "2,113.63 USD" in html


def test_the_estimate_form_has_no_spot_tier_to_contradict_the_ratio(member):
    html = member.get(ESTIMATE).content.decode()
    assert '<label for="id_tier">Other nodes</label>' in html
    assert '<option value="spot"' not in html
    assert "Share of the nodes on spot, 0 to 1, in whole nodes." in html


def test_estimate_errors_name_fields_by_their_label(member):
    response = member.get(
        ESTIMATE,
        {
            "gpu_type": "a100-80gb",
            "gpus_per_node": 0,
            "nodes": 0,
            "region": "us-west",
            "tier": "on_demand",
            "spot_ratio": 0,
            "hours": 1,
        },
        **HTMX,
    )
    html = response.content.decode()
    assert "Nodes: Must be at least 1 node." in html
    assert "Gpus_per_node" not in html and "Nodes:" in html


def test_estimate_page_without_js_shows_field_errors(member):
    response = member.get(
        ESTIMATE,
        {
            "gpus_per_node": 0,
            "nodes": 1,
            "region": "us-west",
            "tier": "on_demand",
            "spot_ratio": 0,
            "hours": 1,
        },
    )

    assert response.status_code == 200
    assert "<html" in response.content.decode()
    assert "cpus" in response.context["estimate_form"].errors


# --- images ----


def private_image(tenant, user):
    return services.image_create(
        tenant=tenant,
        slug="secret-trainer",
        reference="ghcr.io/acme/secret-trainer:1",
        user=user,
        name="Secret trainer",
        kind="framework",
        compatible_with=["nvidia"],
    )


def test_images_page_lists_public_and_own_private_images_only(catalog, world, other_world):
    private_image(world.tenant, world.admin)
    ours = signed_in_client(world.member, world.tenant).get(IMAGES).content.decode()
    theirs = signed_in_client(other_world.member, other_world.tenant).get(IMAGES).content.decode()

    assert 'data-image="secret-trainer"' in ours
    assert "Secret trainer" not in theirs
    assert "secret-trainer" not in theirs
    for html in (ours, theirs):
        assert 'data-image="ngc-pytorch-24-10"' in html


def test_images_page_filters_and_htmx_partial(member):
    response = member.get(IMAGES, {"kind": "full_stack"}, HTTP_HX_TARGET="image-list", **HTMX)

    html = response.content.decode()
    assert html.lstrip().startswith('<section id="image-list"')
    assert 'data-image="ngc-pytorch-24-10"' in html
    assert 'data-image="cuda-12-4-runtime"' not in html
    html = member.get(IMAGES, {"q": "mindspore"}).content.decode()
    assert 'data-image="mindspore-ascend-2-3"' in html
    assert 'data-image="ngc-pytorch-24-10"' not in html
    html = member.get(IMAGES, {"vendor": "amd"}).content.decode()
    assert 'data-image="rocm-6-2"' in html
    assert 'data-image="tensorflow-2-17-gpu"' not in html


def new_image_form(reference):
    return {
        "new-slug": "trainer",
        "new-name": "Trainer",
        "new-reference": reference,
        "new-kind": "framework",
        "new-compatible_with": ["nvidia"],
        "new-size_gib": "1.0",
    }


def test_admin_adds_a_private_image_on_the_page(catalog, world):
    client = signed_in_client(world.admin, world.tenant)

    response = client.post(IMAGES, new_image_form("ghcr.io/acme/trainer:1"))

    assert response.status_code == 302
    image = Image.objects.get(tenant=world.tenant)
    assert image.reference == "ghcr.io/acme/trainer:1"
    assert image.default_command == [] and image.ports == []
    assert image.interactive == ""  # a batch image unless marked


def test_an_image_marked_for_dev_environments_shows_it_in_the_catalog(catalog, world):
    client = signed_in_client(world.admin, world.tenant)
    form = {**new_image_form("ghcr.io/acme/trainer:1"), "new-interactive": "both"}
    assert client.post(IMAGES, form).status_code == 302
    assert Image.objects.get(tenant=world.tenant).interactive == "both"
    html = client.get(IMAGES, {"q": "trainer"}).content.decode()
    assert 'data-testid="image-interactive"><span class="badge">SSH and Jupyter</span>' in html
    bad = client.post(IMAGES, {**form, "new-slug": "other", "new-interactive": "vscode"})
    assert bad.status_code == 200 and bad.context["image_form"].errors["interactive"]


def test_image_from_a_registry_not_allowed_shows_a_field_error(catalog, world):
    client = signed_in_client(world.admin, world.tenant)

    response = client.post(IMAGES, new_image_form("quay.io/acme/trainer:1"))

    assert response.status_code == 200
    assert response.context["image_form"].errors["reference"]
    assert not Image.objects.filter(tenant=world.tenant).exists()


@pytest.mark.parametrize("role", ["member", "viewer", "finance"])
def test_others_cannot_add_or_retire_on_the_page(catalog, world, role):
    image = private_image(world.tenant, world.admin)
    client = signed_in_client(getattr(world, role), world.tenant)

    assert client.post(IMAGES, new_image_form("ghcr.io/acme/trainer:1")).status_code in (403, 404)
    retire = reverse("marketplace:image_deactivate", args=[image.pk])
    assert client.post(retire).status_code == 403
    assert Image.objects.filter(tenant=world.tenant).count() == 1
    image.refresh_from_db()
    assert image.is_active


def test_retire_page_is_404_for_another_tenants_image(catalog, world, other_world):
    image = private_image(world.tenant, world.admin)
    client = signed_in_client(other_world.admin, other_world.tenant)
    retire = reverse("marketplace:image_deactivate", args=[image.pk])

    assert client.get(retire).status_code == 404
    assert client.post(retire).status_code == 404
    image.refresh_from_db()
    assert image.is_active

    own = signed_in_client(world.admin, world.tenant)
    assert own.get(retire).status_code == 200
    assert own.post(retire).status_code == 302
    image.refresh_from_db()
    assert not image.is_active


# --- confirm then act (console.confirm), on the retire page ----


def test_retire_asks_first_naming_the_image_then_retires(catalog, world):
    image = private_image(world.tenant, world.admin)
    client = signed_in_client(world.admin, world.tenant)
    retire = reverse("marketplace:image_deactivate", args=[image.pk])

    confirm = client.get(retire)
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert "Retire private image" in page and "Stop offering “Secret trainer”" in page
    assert f'href="{IMAGES}"' in page  # cancel goes back
    image.refresh_from_db()
    assert image.is_active

    done = client.post(retire, follow=True)
    assert done.redirect_chain == [(IMAGES, 302)]
    assert "“Secret trainer” is no longer offered for new jobs." in done.content.decode()
    image.refresh_from_db()
    assert not image.is_active


def test_an_htmx_retire_answers_with_a_client_redirect(catalog, world):
    image = private_image(world.tenant, world.admin)
    client = signed_in_client(world.admin, world.tenant)

    response = client.post(reverse("marketplace:image_deactivate", args=[image.pk]), **HTMX)

    assert response.status_code == 200
    assert response["HX-Redirect"] == IMAGES
    image.refresh_from_db()
    assert not image.is_active


def test_a_refused_action_is_an_error_message_back_on_the_cancel_page(rf, world):
    request = rf.post("/anything/")
    request.user, request.htmx = world.admin, False
    request.session = {}
    request._messages = FallbackStorage(request)

    def refuse() -> None:
        raise ServiceError("Not now.")

    response = confirm_then_act(
        request,
        title="Delete it",
        message="Delete it?",
        confirm_label="Delete",
        act=refuse,
        success_url="/done/",
        success_message="Deleted.",
        cancel_url="/back/",
    )
    assert (response.status_code, response["Location"]) == (302, "/back/")
    assert [str(m) for m in get_messages(request)] == ["Not now."]


# --- price book panels (marketplace.extensions) ----


def test_price_book_shows_the_registered_panels(catalog, staff_user, world, monkeypatch):
    monkeypatch.setattr(extensions, "_price_book_panels", {})
    extensions.price_book_panel_register(
        "test.gaps",
        lambda: extensions.Panel(
            template_name="billing/partials/price_gaps.html",
            context={"price_gaps": [{"gpu_type": "cpu", "region": "local", "records": 3}]},
        ),
    )
    extensions.price_book_panel_register("test.nothing", lambda: None)

    page = signed_in_client(staff_user, world.tenant).get(reverse("marketplace:staff_prices"))

    html = page.content.decode()
    assert 'data-testid="price-gaps"' in html and "Usage without a price" in html
    assert html.count("<h2>Usage without a price</h2>") == 1


def test_billing_registers_its_price_gaps_panel(catalog, staff_user, world, monkeypatch):
    monkeypatch.setattr(extensions, "_price_book_panels", {})
    panels.register()
    panels.register()  # ready() may run twice: still one panel
    staff = signed_in_client(staff_user, world.tenant)
    prices = reverse("marketplace:staff_prices")

    assert 'data-testid="price-gaps"' not in staff.get(prices).content.decode()  # no gap yet
    gap = {"gpu_type": "cpu", "region": "local", "records": 2, "note": "no price for CPU"}
    monkeypatch.setattr(panels, "price_gaps", lambda: [gap])
    html = staff.get(prices).content.decode()
    assert html.count('data-testid="price-gaps"') == 1 and "no price for CPU" in html


def test_the_private_image_form_labels_its_fields_for_people(catalog, world):
    html = signed_in_client(world.admin, world.tenant).get(IMAGES).content.decode()
    for label in ("CUDA version", "ROCm version", "Size (GiB)"):
        assert f">{label}</label>" in html
    assert "Cuda version" not in html and "Size gib" not in html
