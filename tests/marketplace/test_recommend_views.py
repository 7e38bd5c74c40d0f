"""The GPU recommender in the console: its panel on the launch form and the estimate
page, the htmx options table with "Use" buttons, the page without JS, errors."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from marketplace import services
from marketplace.models import NodePool
from tests.conftest import signed_in_client

RECOMMEND = reverse("marketplace:recommend")
HTMX = {"HTTP_HX_REQUEST": "true"}
SEVEN_B_FINETUNE = {
    "recommend-parameters_billion": "7",
    "recommend-workload": "full_finetune",
    "recommend-precision": "bf16",
    "recommend-sequence_length": "4096",
    "recommend-batch_size": "8",
}


@pytest.fixture
def member(catalog, world):
    return signed_in_client(world.member, world.tenant)


def test_the_launch_form_and_the_estimate_page_carry_the_panel_filling_their_form(member):
    launch = member.get(reverse("jobs:launch")).content.decode()
    estimate = member.get(reverse("marketplace:estimate")).content.decode()

    assert 'data-recommend-fills="#launch-form"' in launch
    assert 'id="launch-form"' in launch
    assert 'data-recommend-fills="#estimate-form"' in estimate
    assert 'id="estimate-form"' in estimate
    for html in (launch, estimate):
        assert "Recommend GPUs" in html
        assert f'hx-get="{RECOMMEND}"' in html
        assert 'name="recommend-parameters_billion"' in html


def test_the_partial_shows_the_need_and_options_with_use_buttons(member):
    response = member.get(RECOMMEND, SEVEN_B_FINETUNE, **HTMX)

    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html
    need = re.search(r"GPU memory needed: ([\d.]+) GiB", html)
    assert need and 104 < float(need.group(1)) < 134
    assert "kept in reserve" in html and "Optimizer state" in html
    # The cheapest fitting H100 option: 2 GPUs on one node in US West, 2 × 2.99.
    assert (
        'data-gpu-type="h100-80gb" data-gpus-per-node="2" data-nodes="1" data-region="us-west"'
        in html
    )
    assert "5.98 USD" in html
    options = response.context["recommendation"].options
    assert [o.price_per_hour for o in options] == sorted(o.price_per_hour for o in options)


def test_the_partial_prices_with_the_tenant_discount(member, world):
    services.tenant_pricing_set(tenant=world.tenant, discount_percent=10, note="", user=world.owner)
    html = member.get(RECOMMEND, SEVEN_B_FINETUNE, **HTMX).content.decode()
    assert "5.38 USD" in html and "5.98 USD" not in html


def test_the_page_without_js_has_the_table_but_no_use_buttons(member):
    response = member.get(RECOMMEND, SEVEN_B_FINETUNE)

    html = response.content.decode()
    assert response.status_code == 200 and "<html" in html
    assert 'data-testid="recommend-table"' in html
    assert "data-recommend-use" not in html


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"recommend-parameters_billion": "0"}, "Model size"),
        ({"recommend-parameters_billion": "-3"}, "Model size"),
        ({"recommend-workload": "distill"}, "Workload"),
        ({"recommend-precision": "int4"}, "Full fine-tune runs at fp32, bf16, fp16"),
        ({"recommend-batch_size": "100000"}, "Batch size"),
    ],
)
def test_bad_input_shows_an_error_beside_its_label(member, overrides, message):
    response = member.get(RECOMMEND, {**SEVEN_B_FINETUNE, **overrides}, **HTMX)

    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-testid="recommend-errors"' in html
    assert message in html
    assert 'data-testid="recommend-table"' not in html


def test_no_pool_is_an_empty_state(member):
    html = member.get(
        RECOMMEND, {**SEVEN_B_FINETUNE, "recommend-parameters_billion": "0.5"}, **HTMX
    ).content.decode()
    assert 'data-testid="recommend-table"' in html
    NodePool.objects.exclude(gpu_type=None).update(is_active=False)
    html = member.get(RECOMMEND, SEVEN_B_FINETUNE, **HTMX).content.decode()
    assert 'data-testid="recommend-empty"' in html


def test_the_recommender_needs_sign_in(catalog, client):
    response = client.get(RECOMMEND, SEVEN_B_FINETUNE)
    assert response.status_code == 302
