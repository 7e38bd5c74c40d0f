"""The SDK's `count` spelling: errors on what it was split into are named `count`."""

from __future__ import annotations

import pytest
from gpugeek.errors import BudgetExceeded, ValidationError
from gpugeek.spec import errors_named_count


def test_errors_on_nodes_and_gpus_per_node_are_counts_errors():
    with pytest.raises(ValidationError) as caught, errors_named_count(True):
        raise ValidationError(
            "invalid",
            errors={"nodes": ["at most 8 GPUs"], "gpus_per_node": ["8 per node"], "region": ["?"]},
        )
    assert caught.value.errors == {"count": ["at most 8 GPUs", "8 per node"], "region": ["?"]}
    assert "count: at most 8 GPUs 8 per node" in str(caught.value)


def test_a_request_without_count_keeps_the_apis_names():
    with pytest.raises(ValidationError) as caught, errors_named_count(False):
        raise ValidationError("invalid", errors={"nodes": ["at least 1"]})
    assert caught.value.errors == {"nodes": ["at least 1"]}


def test_other_errors_pass_unchanged():
    with pytest.raises(BudgetExceeded) as caught, errors_named_count(True):
        raise BudgetExceeded("budget exhausted")
    assert caught.value.errors == {}
