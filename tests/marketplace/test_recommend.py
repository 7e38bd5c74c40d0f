"""The GPU recommender: the memory rules against issue 31's worked examples, and the
recommendations API over the test catalog (prices, discount, capacity, bad input)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from console.service_errors import ServiceError
from marketplace import services
from marketplace.models import NodePool, Region, Tier
from marketplace.pricing import estimate_cost
from marketplace.recommend import (
    GIB,
    MEMORY_MARGIN,
    Precision,
    Workload,
    configuration,
    gpu_recommendations,
    lora_parameters,
    memory_needed,
    model_shape,
)
from tests.conftest import token_client
from tests.factories import MembershipFactory, TenantFactory, UserFactory

D = Decimal
RECOMMENDATIONS = "/api/v1/recommendations"
SEVEN_B_FINETUNE = {
    "parameters_billion": 7,
    "workload": "full_finetune",
    "precision": "bf16",
    "sequence_length": 4096,
    "batch_size": 8,
}


def need(parameters_billion, workload, precision, sequence_length=2048, batch_size=1, **shape):
    return memory_needed(
        shape=model_shape(parameters_billion=parameters_billion, **shape),
        workload=Workload(workload),
        precision=Precision(precision),
        sequence_length=sequence_length,
        batch_size=batch_size,
    )


# --- the rules ----


def test_model_shape_is_derived_from_the_parameter_count():
    seven = model_shape(parameters_billion=7)
    # Llama-2-7B is 4096 × 32; the rule gives the nearest whole heads of 128.
    assert (seven.hidden_size, seven.layers, seven.head_dim) == (4224, 33, 128)
    assert seven.heads == seven.kv_heads == 33
    assert 12 * seven.layers * seven.hidden_size**2 == pytest.approx(7e9, rel=0.05)
    seventy = model_shape(parameters_billion=70)
    assert 12 * seventy.layers * seventy.hidden_size**2 == pytest.approx(70e9, rel=0.05)
    # Given fields win; the rest still follows the parameter count.
    llama = model_shape(parameters_billion=7, hidden_size=4096, kv_heads=8)
    assert (llama.hidden_size, llama.layers, llama.heads, llama.kv_heads) == (4096, 35, 32, 8)
    assert model_shape(parameters_billion=7, layers=32).hidden_size == 4224


def test_a_7b_full_finetune_in_bf16_needs_16_bytes_a_parameter_before_activations():
    memory = need(7, "full_finetune", "bf16", 4096, 8)

    states = memory.weights + memory.gradients + memory.optimizer
    # The "≈ 112" is 7B × 16 bytes = 112 GB (10⁹ bytes), 104.3 GiB.
    assert states == 7e9 * 16 == 112e9
    assert memory.kv_cache == 0
    assert memory.activations > 0
    # No single 80 GB card holds it, even before the margin; two do, with it.
    assert states > 80 * GIB
    assert memory.total * (1 + MEMORY_MARGIN) <= 2 * 80 * GIB


def test_full_training_in_fp32_is_16_bytes_too_and_pretraining_matches_finetuning():
    fp32 = need(1, "pretrain", "fp32")
    assert (fp32.weights, fp32.gradients, fp32.optimizer) == (4e9, 4e9, 8e9)
    assert need(1, "pretrain", "bf16") == need(1, "full_finetune", "bf16")


def test_inference_weights_are_the_precision_s_bytes_and_the_kv_cache_the_formula():
    shape = model_shape(parameters_billion=7, hidden_size=4096, layers=32, kv_heads=8)
    for precision, per_parameter in [("bf16", 2), ("int8", 1), ("int4", 0.5), ("fp32", 4)]:
        memory = memory_needed(
            shape=shape,
            workload=Workload.INFERENCE,
            precision=Precision(precision),
            sequence_length=4096,
            batch_size=8,
        )
        assert memory.weights == 7e9 * per_parameter
        assert memory.gradients == memory.optimizer == 0
        kv_bytes = 4 if precision == "fp32" else 2
        assert memory.kv_cache == 2 * 32 * 8 * 128 * 4096 * 8 * kv_bytes


def test_7b_inference_in_int8_fits_one_24_gb_card():
    memory = need(7, "inference", "int8", 4096, 1)

    assert memory.total * (1 + MEMORY_MARGIN) <= 24 * GIB
    assert configuration(
        need_with_margin=memory.total * (1 + MEMORY_MARGIN), gpu_memory_gib=24, gpus_per_node=4
    ) == (1, 1, 1)


def test_lora_freezes_the_base_and_trains_a_small_adapter_qlora_quantizes_the_base():
    shape = model_shape(parameters_billion=70)
    adapter = lora_parameters(shape, 16)
    assert 0 < adapter < shape.parameters * 0.01
    lora = need(70, "lora", "bf16")
    assert lora.weights == 70e9 * 2 + adapter * 4
    assert (lora.gradients, lora.optimizer) == (adapter * 4, adapter * 8)
    qlora = need(70, "qlora", "int4")
    assert qlora.weights == 70e9 * 0.5 + adapter * 4
    # A 70B LoRA needs more than two 80 GB cards hold with the margin.
    assert lora.total * (1 + MEMORY_MARGIN) > 2 * 80 * GIB > lora.total


@pytest.mark.parametrize(
    ("workload", "precision"),
    [("full_finetune", "int8"), ("pretrain", "int4"), ("lora", "int4"), ("qlora", "bf16")],
)
def test_a_workload_without_a_path_at_that_precision_is_refused(workload, precision):
    with pytest.raises(ServiceError) as refused:
        need(7, workload, precision)
    assert refused.value.field == "precision"


def test_configuration_spreads_gpus_evenly_over_as_few_nodes_as_hold_them():
    assert configuration(need_with_margin=150 * GIB, gpu_memory_gib=80, gpus_per_node=8) == (
        2,
        2,
        1,
    )
    # 10 GPUs needed on 8-GPU nodes: 2 nodes of 5.
    assert configuration(need_with_margin=790 * GIB, gpu_memory_gib=80, gpus_per_node=8) == (
        10,
        5,
        2,
    )
    assert configuration(need_with_margin=1, gpu_memory_gib=80, gpus_per_node=8) == (1, 1, 1)


# --- recommendations over the catalog ----


@pytest.fixture
def api(catalog, world):
    return token_client(world.member, world.tenant)


def recommend(api, **body):
    response = api.post(RECOMMENDATIONS, {**SEVEN_B_FINETUNE, **body}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_7b_full_finetune_options_start_at_two_80_gb_cards_or_one_bigger(api):
    body = recommend(api)

    assert set(body) >= {"memory_needed_gib", "breakdown", "options", "memory_margin", "model"}
    assert set(body["breakdown"]) == {
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "kv_cache",
    }
    assert body["memory_margin"] == MEMORY_MARGIN
    assert 104.3 < body["memory_needed_gib"] < 160 / (1 + MEMORY_MARGIN)
    options = body["options"]
    assert options and all(o["fits"] for o in options)
    by_type = {(o["gpu_type"], o["region"]): o for o in options}
    h100 = by_type[("h100-80gb", "us-west")]
    assert (h100["gpus"], h100["gpus_per_node"], h100["nodes"]) == (2, 2, 1)
    assert h100["available_now"] is True
    assert h100["currency"] == "USD"
    assert by_type[("h200-141gb", "us-west")]["gpus"] == 2  # 141 < 121 GiB × 1.2
    assert by_type[("mi300x", "us-east")]["gpus"] == 1  # 192 GB
    # 24 GB cards: 8 of them, on 2 of the 4-GPU nodes.
    l4 = by_type[("l4", "us-east")]
    assert (l4["gpus"], l4["gpus_per_node"], l4["nodes"]) == (8, 4, 2)
    prices = [D(o["price_per_hour"]) for o in options]
    assert prices == sorted(prices)
    # Only on-demand pools by default: no spot-only L40S.
    assert "l40s" not in {o["gpu_type"] for o in options}


def test_option_prices_are_the_estimate_s_with_the_tenant_discount(api, world, other_world):
    services.tenant_pricing_set(
        tenant=world.tenant, discount_percent=D(10), note="", user=world.owner
    )
    ours = recommend(api, region="us-west")["options"]
    theirs = recommend(token_client(other_world.member, other_world.tenant), region="us-west")
    for option in ours:
        assert option["region"] == "us-west"
        estimate = estimate_cost(
            gpu_type=option_gpu(option),
            region=Region.objects.get(slug="us-west"),
            nodes=option["nodes"],
            gpus_per_node=option["gpus_per_node"],
            tenant=world.tenant,
        )
        assert D(option["price_per_hour"]) == estimate.hourly
    h100_ours = next(o for o in ours if o["gpu_type"] == "h100-80gb")
    h100_theirs = next(o for o in theirs["options"] if o["gpu_type"] == "h100-80gb")
    assert h100_theirs["price_per_hour"] == "5.98"  # 2 × 2.99
    assert h100_ours["price_per_hour"] == "5.38"  # 10 % off


def option_gpu(option):
    return NodePool.objects.filter(gpu_type__slug=option["gpu_type"]).first().gpu_type


def test_7b_inference_in_int8_recommends_one_24_gb_card_first(api):
    options = recommend(
        api, workload="inference", precision="int8", sequence_length=4096, batch_size=1
    )["options"]

    cheapest = options[0]
    assert (cheapest["gpu_type"], cheapest["gpus"], cheapest["nodes"]) == ("l4", 1, 1)
    assert cheapest["gpu_memory_gib"] == 24 and cheapest["fits"]
    assert all(o["gpus"] == 1 for o in options)


def test_a_70b_lora_needs_at_least_two_80_gb_cards(api):
    options = recommend(api, parameters_billion=70, workload="lora", precision="bf16")["options"]

    eighty = [o for o in options if o["gpu_memory_gib"] == 80]
    assert eighty and all(o["gpus"] >= 2 for o in eighty)


def test_a_configuration_bigger_than_the_pools_does_not_fit_and_comes_last(api):
    body = recommend(api, parameters_billion=200, workload="pretrain", batch_size=1)

    fits = [o["fits"] for o in body["options"]]
    assert True in fits and False in fits
    assert fits == sorted(fits, reverse=True)
    l4 = next(o for o in body["options"] if o["gpu_type"] == "l4")
    assert l4["fits"] is False and l4["nodes"] > 8


def test_available_now_follows_the_pools_free_gpus(api):
    NodePool.objects.filter(gpu_type__slug="h100-80gb", tier=Tier.ON_DEMAND).update(in_use_gpus=63)
    h100 = next(
        o for o in recommend(api, region="us-west")["options"] if o["gpu_type"] == "h100-80gb"
    )

    assert h100["fits"] is True and h100["available_now"] is False
    assert h100["free_gpus"] == 1


def test_a_tenant_not_allowed_on_the_host_gets_no_host_pool_and_is_refused_its_region(catalog):
    outsider = TenantFactory(slug="outsider", may_run_on_host=False)
    user = UserFactory(email="m@outsider.test")
    MembershipFactory(tenant=outsider, user=user, role="member")
    client = token_client(user, outsider)
    response = client.post(RECOMMENDATIONS, {**SEVEN_B_FINETUNE, "region": "local"}, format="json")
    assert response.status_code == 400
    assert "region" in response.json()


def test_the_recommender_reads_a_bounded_number_of_queries(api, django_assert_max_num_queries):
    recommend(api)  # warm the price book cache
    with django_assert_max_num_queries(8):
        recommend(api)


def test_a_larger_margin_asks_for_more_gpus(world, catalog):
    common = {
        "tenant": world.tenant,
        "parameters_billion": 7,
        "workload": Workload.FULL_FINETUNE,
        "precision": Precision.BF16,
        "sequence_length": 4096,
        "batch_size": 8,
    }
    default = gpu_recommendations(**common)
    wary = gpu_recommendations(**common, memory_margin=0.5)

    def h100(recommendation):
        return next(o for o in recommendation.options if o.gpu_type.slug == "h100-80gb")

    assert default.memory_margin == MEMORY_MARGIN and wary.memory_margin == 0.5
    assert (h100(default).gpus, h100(wary).gpus) == (2, 3)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"parameters_billion": 0}, "parameters_billion"),
        ({"parameters_billion": -7}, "parameters_billion"),
        ({"parameters_billion": 1e9}, "parameters_billion"),
        ({"parameters_billion": "seven"}, "parameters_billion"),
        ({"workload": "distill"}, "workload"),
        ({"precision": "fp8"}, "precision"),
        ({"workload": "full_finetune", "precision": "int4"}, "precision"),
        ({"sequence_length": 0}, "sequence_length"),
        ({"sequence_length": 10**9}, "sequence_length"),
        ({"batch_size": -1}, "batch_size"),
        ({"batch_size": 10**6}, "batch_size"),
        ({"kv_heads": 500}, "kv_heads"),
        ({"hidden_size": 10**7}, "hidden_size"),
        ({"region": "mars"}, "region"),
        ({"tier": "forever"}, "tier"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, overrides, field):
    response = api.post(RECOMMENDATIONS, {**SEVEN_B_FINETUNE, **overrides}, format="json")

    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid" and body["detail"]
    assert field in body, body


def test_missing_fields_are_named(api):
    response = api.post(RECOMMENDATIONS, {}, format="json")

    assert response.status_code == 400
    assert {"parameters_billion", "workload", "precision"} <= set(response.json())


def test_the_recommender_needs_a_signed_in_member(catalog, client):
    response = client.post(RECOMMENDATIONS, SEVEN_B_FINETUNE, content_type="application/json")
    assert response.status_code in (401, 403)
