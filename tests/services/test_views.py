"""The services pages: empty state, deploy form with errors in place, a service's page
(endpoint and curl, replicas, revisions with rollback, tokens shown once), confirmations
for what can't be undone, and another tenant's 404s."""

from __future__ import annotations

import pytest
from django.urls import reverse

from jobs.services import tenant_secret_set
from services import reconcile, services, traffic
from services.models import Service, ServiceToken
from tests.conftest import signed_in_client
from tests.factories import VolumeFactory
from tests.services.conftest import echo_spec

FORM = {
    "name": "echo",
    "image": "python:3.11-slim",
    "command": "python3 -m http.server",
    "port": "8080",
    "region": "local",
    "cpus": "1",
    "min_replicas": "2",
    "max_replicas": "4",
    "autoscale_metric": "rps",
    "autoscale_target": "2.5",
    "readiness_path": "/",
    "auth": "token",
    "env": "MODEL=small\nDEBUG=1",
}


@pytest.fixture
def service(world, catalog):
    return services.service_create(tenant=world.tenant, user=world.owner, spec=echo_spec())


def test_the_list_has_an_empty_state_and_a_deploy_form(owner_client, catalog):
    page = owner_client.get(reverse("services:list")).content.decode()
    assert 'data-testid="services-empty"' in page and "Deploy a service" in page


def test_deploying_from_the_form(owner_client, catalog):
    answer = owner_client.post(reverse("services:list"), FORM)
    service = Service.objects.get()
    assert answer.status_code == 302 and answer["Location"] == reverse(
        "services:detail", args=[service.pk]
    )
    assert service.command == ["python3", "-m", "http.server"]
    assert service.env == {"MODEL": "small", "DEBUG": "1"}
    assert (service.autoscale_metric, service.autoscale_target) == ("rps", 2.5)
    assert service.desired_replicas == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"readiness_path": "ready"}, "must start with /"),
        ({"min_replicas": "5", "max_replicas": "3"}, "can&#x27;t be more than"),
        ({"env": "NOEQUALS"}, "not NAME=value"),
        ({"command": "python3 'unclosed"}, "can&#x27;t be read"),
    ],
)
def test_bad_input_shows_on_the_form(owner_client, catalog, change, message):
    answer = owner_client.post(reverse("services:list"), {**FORM, **change})
    assert answer.status_code == 200 and message in answer.content.decode()
    assert not Service.objects.exists()


def test_secrets_are_named_on_the_form_and_shown_by_name(owner_client, world, catalog):
    tenant_secret_set(tenant=world.tenant, user=world.owner, name="HF_TOKEN", value="hf_x")
    answer = owner_client.post(reverse("services:list"), {**FORM, "secrets": "NOPE"})
    assert answer.status_code == 200 and "No secret named NOPE" in answer.content.decode()
    answer = owner_client.post(reverse("services:list"), {**FORM, "secrets": "HF_TOKEN,"})
    service = Service.objects.get()
    assert answer.status_code == 302 and service.secrets == ["HF_TOKEN"]
    page = owner_client.get(answer["Location"]).content.decode()
    assert "<code>HF_TOKEN</code>" in page and "hf_x" not in page


def test_volumes_are_named_on_the_form_and_shown_on_the_page(owner_client, world, catalog):
    VolumeFactory(tenant=world.tenant, name="weights")
    answer = owner_client.post(reverse("services:list"), {**FORM, "volumes": "weights"})
    assert answer.status_code == 200 and "Line 1 is not NAME:/path" in answer.content.decode()
    answer = owner_client.post(reverse("services:list"), {**FORM, "volumes": "nope:/models"})
    assert answer.status_code == 200 and "No volume named nope" in answer.content.decode()
    assert not Service.objects.exists()
    answer = owner_client.post(reverse("services:list"), {**FORM, "volumes": "weights:/models\n"})
    service = Service.objects.get()
    assert answer.status_code == 302 and service.volumes == [{"name": "weights", "path": "/models"}]
    page = owner_client.get(answer["Location"]).content.decode()
    assert "<code>weights</code> at <code>/models</code>" in page and "read-only" in page


def test_gpu_replicas_are_chosen_on_the_form_and_shown_on_the_page(owner_client, catalog):
    page = owner_client.get(reverse("services:list")).content.decode()
    assert '<option value="h100-80gb">' in page and "None (CPU)" in page
    gpu = {**FORM, "region": "us-west", "image": "pytorch-2-5-cuda12-4", "gpu_type": "h100-80gb"}
    answer = owner_client.post(reverse("services:list"), {**gpu, "gpus_per_replica": "9"})
    assert answer.status_code == 200 and "1 to 8 GPUs per replica" in answer.content.decode()
    answer = owner_client.post(reverse("services:list"), {**gpu, "gpus_per_replica": "2"})
    service = Service.objects.get()
    assert answer.status_code == 302 and service.gpus_per_replica == 2
    page = owner_client.get(answer["Location"]).content.decode()
    assert "2 × NVIDIA H100" in page
    assert "1 CPU, 2 GPUs" in page  # the revision's row
    listed = owner_client.get(reverse("services:list")).content.decode()
    assert f"2 × {service.gpu_type.model}" in listed


def test_a_member_asking_for_critical_sees_why_on_the_form(world, catalog):
    member = signed_in_client(world.member, world.tenant)
    answer = member.post(reverse("services:list"), {**FORM, "priority": "critical"})
    assert answer.status_code == 200 and "Only owners and admins" in answer.content.decode()
    assert not Service.objects.exists()
    answer = member.post(reverse("services:list"), {**FORM, "priority": "low"})
    assert answer.status_code == 302 and Service.objects.get().priority == "low"


def test_the_service_page_shows_endpoint_curl_revisions(owner_client, service):
    page = owner_client.get(reverse("services:detail", args=[service.pk])).content.decode()
    assert "http://testserver/svc/acme/echo/" in page
    assert "curl -H 'Authorization: Bearer $SERVICE_TOKEN' http://testserver/svc/acme/echo/" in page
    assert 'data-testid="revision-table"' in page and "No replicas yet" in page
    assert "No scaling decisions yet" in page


@pytest.mark.usefixtures("replicas_cleanup")
def test_the_service_page_shows_wanted_replicas_and_scaling_decisions(owner_client, world, catalog):
    zero = services.service_create(
        tenant=world.tenant, user=None, spec=echo_spec(name="zero", min_replicas=0)
    )
    traffic.held_enter(service_id=zero.pk)
    reconcile.service_reconcile(service_id=zero.pk)
    page = owner_client.get(reverse("services:detail", args=[zero.pk])).content.decode()
    assert 'data-testid="replicas-wanted">1' in page
    assert 'data-testid="scale-event-table"' in page
    assert "0 → 1" in page and "Request at zero" in page


def test_a_token_is_shown_once(owner_client, service):
    url = reverse("services:detail", args=[service.pk])
    page = owner_client.post(url, {"name": "web"}).content.decode()
    assert 'data-testid="new-token-value"' in page and "ggs_" in page
    again = owner_client.get(url).content.decode()
    assert 'data-testid="new-token-value"' not in again
    token = ServiceToken.objects.get()
    revoke = reverse("services:token_revoke", args=[service.pk, token.pk])
    assert "Revoke service token" in owner_client.get(revoke).content.decode()
    owner_client.post(revoke)
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_rollback_asks_first(owner_client, service):
    services.service_update(service=service, user=None, changes={"image": "python:3.12"})
    url = reverse("services:rollback", args=[service.pk, 1])
    assert "Run revision 1" in owner_client.get(url).content.decode()
    owner_client.post(url)
    service.refresh_from_db()
    assert service.current_revision.number == 3


def test_delete_asks_first(owner_client, service):
    url = reverse("services:delete", args=[service.pk])
    assert "can&#x27;t be undone" in owner_client.get(url).content.decode()
    assert owner_client.post(url).status_code == 302
    assert not Service.objects.exists()


def test_a_viewer_sees_no_forms(world, service):
    viewer = signed_in_client(world.viewer, world.tenant)
    assert "Deploy a service" not in viewer.get(reverse("services:list")).content.decode()
    page = viewer.get(reverse("services:detail", args=[service.pk])).content.decode()
    assert "Create token" not in page and "Delete service" not in page
    assert viewer.post(reverse("services:list"), FORM).status_code == 403


def test_another_tenant_gets_404_on_every_page(world, other_world, catalog):
    foreign = services.service_create(
        tenant=other_world.tenant, user=None, spec=echo_spec(name="globex-only")
    )
    token, _ = services.service_token_create(service=foreign, user=None, name="t")
    client = signed_in_client(world.owner, world.tenant)
    for url in (
        reverse("services:detail", args=[foreign.pk]),
        reverse("services:delete", args=[foreign.pk]),
        reverse("services:rollback", args=[foreign.pk, 1]),
        reverse("services:token_revoke", args=[foreign.pk, token.pk]),
    ):
        assert client.get(url).status_code == 404, url
        assert client.post(url).status_code == 404, url
    assert "globex-only" not in client.get(reverse("services:list")).content.decode()
    assert Service.objects.filter(pk=foreign.pk).exists()
