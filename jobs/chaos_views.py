"""Staff page of the sandbox cluster: its nodes, and the faults staff can inject (spot
reclaim, node failure, XID errors, hung GPUs, API errors or slowness). Writes go through
jobs.services.chaos."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from console.confirm import confirm_then_act
from console.permissions import staff_required
from console.service_errors import ServiceError
from jobs import fleet
from jobs.services import chaos
from marketplace.models import NodePool, Tier


class ApiFaultsForm(forms.Form):
    mode = forms.ChoiceField(
        choices=[("error", "Answer HTTP 500"), ("slow", "Answer late")], initial="error"
    )
    fraction = forms.FloatField(
        min_value=0.01, max_value=1, initial=0.3, help_text="Share of API calls affected."
    )
    seconds = forms.IntegerField(min_value=1, max_value=3600, initial=60)
    delay = forms.FloatField(
        min_value=0.1, max_value=30, initial=2, help_text="Seconds late (slow mode)."
    )


def _page_url() -> str:
    return reverse("jobs:staff_sandbox")


@staff_required
def staff_sandbox(request: HttpRequest) -> HttpResponse:
    available = chaos.chaos_available() is not None
    nodes: list[dict] = []
    error = ""
    if available:
        try:
            nodes = chaos.chaos_nodes()
        except ServiceError as refused:
            error = refused.message
    spot_pools = NodePool.objects.filter(simulated=True, tier=Tier.SPOT, is_active=True)
    return render(
        request,
        "jobs/staff_sandbox.html",
        {
            "available": available,
            "error": error,
            "nodes": nodes,
            "failed_nodes": [node for node in nodes if not node["ready"]],
            "spot_pools": spot_pools.select_related("region", "gpu_type"),
            "faults_form": ApiFaultsForm(),
        },
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_sandbox_reclaim(request: HttpRequest, pool_id: int) -> HttpResponse:
    pool = get_object_or_404(NodePool, pk=pool_id, simulated=True, tier=Tier.SPOT)
    hit = fleet.jobs_on_pool(pool=pool)
    return confirm_then_act(
        request,
        title=f"Reclaim spot capacity of {pool}?",
        details=[
            f"{job.name} (#{job.pk}, {job.tenant.name}): {job.spot_nodes} spot node"
            f"{'' if job.spot_nodes == 1 else 's'}, {job.get_status_display().lower()}"
            for job in hit
        ]
        or ["No job holds capacity on this pool now."],
        message=(
            f"Every pod on the {pool.node_count} node(s) of this pool is disrupted, as when "
            "the cloud takes spot capacity back. These jobs are preempted and requeued:"
        ),
        confirm_label="Reclaim spot capacity",
        act=lambda: chaos.chaos_reclaim_spot(pool=pool, request=request),
        success_url=_page_url(),
        success_message=f"Spot capacity of {pool} reclaimed.",
        cancel_url=_page_url(),
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_sandbox_node_fail(request: HttpRequest, node: str) -> HttpResponse:
    return confirm_then_act(
        request,
        title=f"Fail node {node}?",
        message="The node stops answering (NotReady) and every pod on it is disrupted.",
        confirm_label="Fail node",
        act=lambda: chaos.chaos_node_fail(node=node, request=request),
        success_url=_page_url(),
        success_message=f"Node {node} failed.",
        cancel_url=_page_url(),
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_sandbox_node_xid(request: HttpRequest, node: str) -> HttpResponse:
    return confirm_then_act(
        request,
        title=f"Report an XID error on {node}?",
        message="Its GPUs report XID 79 (fallen off the bus) in their DCGM readings until "
        "the node recovers. The console's self-repair should checkpoint the jobs there, mark "
        "the node suspect and resume them on other nodes.",
        confirm_label="Inject XID 79",
        act=lambda: chaos.chaos_xid_error(node=node, code=79, request=request),
        success_url=_page_url(),
        success_message=f"{node}'s GPUs report XID 79.",
        cancel_url=_page_url(),
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_sandbox_node_stuck(request: HttpRequest, node: str) -> HttpResponse:
    return confirm_then_act(
        request,
        title=f"Hang the GPUs of {node}?",
        message="Its pods keep running but its GPUs read 0 % busy until the node recovers: "
        "a multi-node job with a rank there has a stuck rank, which the console's "
        "self-repair should move to another node after a few minutes.",
        confirm_label="Hang its GPUs",
        act=lambda: chaos.chaos_stuck_gpus(node=node, request=request),
        success_url=_page_url(),
        success_message=f"{node}'s GPUs hang.",
        cancel_url=_page_url(),
    )


@staff_required
@require_POST
def staff_sandbox_node_recover(request: HttpRequest, node: str) -> HttpResponse:
    try:
        chaos.chaos_node_recover(node=node, request=request)
    except ServiceError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Node {node} is back.")
    return redirect(_page_url())


@staff_required
@require_POST
def staff_sandbox_api_faults(request: HttpRequest) -> HttpResponse:
    if request.POST.get("clear"):
        act = lambda: chaos.chaos_api_faults_clear(request=request)  # noqa: E731
        done = "API faults cleared."
    else:
        form = ApiFaultsForm(request.POST)
        if not form.is_valid():
            for field, errors in form.errors.items():
                messages.error(request, f"{field}: {' '.join(errors)}")
            return redirect(_page_url())
        values = form.cleaned_data
        act = lambda: chaos.chaos_api_faults(request=request, **values)  # noqa: E731
        done = (
            f"For {values['seconds']} s, {values['fraction']:.0%} of Kubernetes API calls "
            f"{'fail' if values['mode'] == 'error' else 'are slow'}."
        )
    try:
        act()
    except ServiceError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, done)
    return redirect(_page_url())
