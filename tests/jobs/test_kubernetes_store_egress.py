"""The tenant's NetworkPolicy opens egress to exactly the checkpoint store's address:
its endpoint host as single-address ipBlocks on its one TCP port, and nothing else new
(a folder store or AWS S3 itself adds no rule); the same for the console's address as
jobs reach it (CONSOLE_URL_FOR_JOBS). Golden: GOLDEN_UPDATE=1 regenerates."""

from __future__ import annotations

from jobs.backends.kubernetes import manifests
from jobs.checkpoints.store import checkpoint_store
from tests.jobs.test_kubernetes_manifests import (  # noqa: F401  (pinned_settings: autouse)
    assert_golden,
    pinned_settings,
)


def s3_store(settings, endpoint: str) -> None:
    settings.CHECKPOINT_STORE_URL = "s3://ckpt/gpugeek"
    settings.CHECKPOINT_STORE_ENDPOINT = endpoint
    settings.CHECKPOINT_STORE_REGION = "us-east-1"


def test_a_minio_store_inside_a_denied_range_is_opened_on_its_port_only(settings):
    s3_store(settings, "http://10.20.30.40:9000")
    policy = manifests.network_policy_manifest(7)
    assert_golden("kubernetes_network_policy_store.json", policy)
    egress = policy["spec"]["egress"]
    assert egress[2] == {
        "to": [{"ipBlock": {"cidr": "10.20.30.40/32"}}],
        "ports": [{"protocol": "TCP", "port": 9000}],
    }
    # Only that rule is new: the same policy with a folder store has every other one.
    settings.CHECKPOINT_STORE_URL = "file:///var/lib/gpugeek-checkpoints"
    assert manifests.network_policy_manifest(7)["spec"]["egress"] == egress[:2] + egress[3:]
    assert "10.0.0.0/8" in egress[-1]["to"][0]["ipBlock"]["except"]  # the range stays shut


def test_a_named_host_resolves_to_its_addresses_and_the_scheme_gives_the_port(settings):
    s3_store(settings, "https://localhost")
    rule = manifests.network_policy_manifest(7)["spec"]["egress"][2]
    assert rule["ports"] == [{"protocol": "TCP", "port": 443}]
    cidrs = {block["ipBlock"]["cidr"] for block in rule["to"]}
    assert "127.0.0.1/32" in cidrs and cidrs <= {"127.0.0.1/32", "::1/128"}
    s3_store(settings, "http://[fd00::5]:7480")  # a Ceph gateway on IPv6
    rule = manifests.network_policy_manifest(7)["spec"]["egress"][2]
    assert rule == {
        "to": [{"ipBlock": {"cidr": "fd00::5/128"}}],
        "ports": [{"protocol": "TCP", "port": 7480}],
    }


def test_aws_s3_itself_and_an_unresolvable_host_add_no_rule(settings):
    folder_rules = manifests.network_policy_manifest(7)["spec"]["egress"]
    s3_store(settings, "")
    assert checkpoint_store().network_endpoint() is None
    assert manifests.network_policy_manifest(7)["spec"]["egress"] == folder_rules
    s3_store(settings, "http://no-such-store.invalid:9000")
    assert manifests.network_policy_manifest(7)["spec"]["egress"] == folder_rules


def test_the_consoles_address_for_jobs_is_opened_on_its_port_only(settings):
    without = manifests.network_policy_manifest(7)["spec"]["egress"]
    # A console inside the cluster's network (a denied range), for the checkpoint events.
    settings.CONSOLE_URL_FOR_JOBS = "http://10.96.0.15:8000/"
    egress = manifests.network_policy_manifest(7)["spec"]["egress"]
    assert egress[2] == {
        "to": [{"ipBlock": {"cidr": "10.96.0.15/32"}}],
        "ports": [{"protocol": "TCP", "port": 8000}],
    }
    assert egress[:2] + egress[3:] == without  # nothing else opened
    assert "10.0.0.0/8" in egress[-1]["to"][0]["ipBlock"]["except"]  # the range stays shut
    # Beside the store's rule; the scheme gives the port; no URL or a bad one: no rule.
    s3_store(settings, "http://10.20.30.40:9000")
    settings.CONSOLE_URL_FOR_JOBS = "https://localhost"
    store_rule, console_rule = manifests.network_policy_manifest(7)["spec"]["egress"][2:4]
    assert store_rule["ports"] == [{"protocol": "TCP", "port": 9000}]
    assert console_rule["ports"] == [{"protocol": "TCP", "port": 443}]
    assert "127.0.0.1/32" in {block["ipBlock"]["cidr"] for block in console_rule["to"]}
    for url in ("", "console.example:8000", "http://host:99999/", "http://no-such.invalid/"):
        settings.CONSOLE_URL_FOR_JOBS = url
        assert manifests.network_policy_manifest(7)["spec"]["egress"][3:] == without[2:]
