"""Job pages: launch, list, detail with timeline and actions. Thin views."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.humanize.templatetags.humanize import naturaltime
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, trigger_client_event

from console.confirm import confirm_then_act
from console.forms import add_service_error
from console.paging import CappedPaginator
from console.permissions import (
    Capability,
    capability_required,
    has_capability,
    job_action_check,
    may_act_on_job,
    may_change_template,
    staff_required,
    template_change_check,
)
from console.service_errors import ServiceError
from console.templatetags.money import format_money
from console.templatetags.numbers import duration_text
from console.tenancy import get_for_tenant_or_404
from jobs import fleet, metrics, repair, selectors, services
from jobs.actors import Actor
from jobs.expectations.selectors import (
    EXPECTATION_COLUMNS,
    EXPECTED_STATUSES,
    Expectation,
    job_expectations,
)
from jobs.extensions import fleet_panels, job_costs, volume_provider
from jobs.forms import LaunchForm, TenantSecretForm, initial_from_link, parse_volume_lines
from jobs.launch_options import LaunchChoices, launch_choices, mount_problem
from jobs.logs.reading import tail_lines
from jobs.models import Job, JobStatus, LaunchTemplate, TenantSecret
from jobs.state import job_run_seconds
from marketplace.models import SuspectNode
from marketplace.price_book_cache import catalog_names, price_book
from marketplace.selectors import (
    default_region,
    price_currency,
    registry_credentials_for_tenant,
)

PAGE_SIZE = 50


@capability_required(Capability.LAUNCH_JOBS)
@require_http_methods(["GET", "POST"])
def launch(request: HttpRequest) -> HttpResponse:
    region = default_region(request.tenant)
    initial = {
        "region": region.slug if region else None,
        "image": "python-3.11",
        "cpus": 1,
        "gpus_per_node": 0,
    }
    template_id = request.GET.get("template")
    template = None
    if template_id and template_id.isdigit():
        template = LaunchTemplate.objects.for_tenant(request.tenant).filter(pk=template_id).first()
        if template is not None:
            initial.update(LaunchForm.initial_from_spec(services.spec_from_template(template)))
    # A "Launch this" link (an offer, an estimate): its choices, what can't be read noted.
    link_initial, link_notes = initial_from_link(request.GET)
    initial.update(link_initial)
    clone_of = request.GET.get("from")
    if clone_of and clone_of.isdigit():
        source = Job.objects.for_tenant(request.tenant).filter(pk=clone_of).first()
        if source is not None:
            initial.update(
                LaunchForm.initial_from_spec(services.spec_from_job(source)),
                name=f"{source.name} (clone)"[:100],
            )
    form = LaunchForm(request.POST or None, tenant=request.tenant, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        spec = services.JobSpec(
            name=data["name"],
            project=data["project"],
            image=data["image"].slug,
            command=data["command"],
            env=data["env"],
            secret_env=data["secret_env"],
            gpus_per_node=data["gpus_per_node"],
            cpus=data["cpus"],
            nodes=data["nodes"],
            spot_ratio=data["spot_ratio"],
            priority=data["priority"],
            max_runtime_minutes=data["max_runtime_minutes"],
            checkpoint_path=data["checkpoint_path"],
            gpu_memory_gib=data["gpu_memory_gib"],
            auto_release=data["auto_release"],
            secrets=data["secrets"],
            ports=list(data["image"].ports) if data["expose_ports"] else [],
            volumes=data["volumes"],
            **form.placement(),
        )
        try:
            # The form posts to its own address: a launch from a template names it.
            job = services.job_submit(
                tenant=request.tenant,
                user=request.user,
                spec=spec,
                request=request,
                launch_template=template,
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            if job.status == JobStatus.QUEUED:
                messages.info(request, f"“{job.name}” is queued: {job.status_reason}.")
            else:
                messages.success(request, f"“{job.name}” launched.")
            return redirect("jobs:detail", job_id=job.pk)
    if not form.is_bound:
        form.choices.notes[:0] = link_notes
    templates = list(LaunchTemplate.objects.for_tenant(request.tenant))
    return render(
        request,
        "jobs/launch.html",
        {
            "form": form,
            "choices": form.choices,
            "volume_warning": _volume_warning(request, form.choices, form["volumes"].value()),
            "templates": templates,
            "deletable_templates": {
                t.pk for t in templates if may_change_template(request.membership, t)
            },
        },
    )


@capability_required(Capability.LAUNCH_JOBS)
def launch_options(request: HttpRequest) -> HttpResponse:
    """The launch form's dependent choices for what it holds now (htmx, on every change
    of where and how big): region, GPUs per node, spot ratio and image options, the free
    capacity and queue it would join, and a warning for volumes elsewhere."""
    params = request.GET
    changed = params.get("changed", "")
    choices = launch_choices(
        tenant=request.tenant,
        **{name: params.get(name) for name in LAUNCH_CHOICE_NAMES},
        switch_image=changed == "gpu_type",
    )
    response = render(
        request,
        "jobs/launch.html#launch-options",
        {
            "choices": choices,
            # Replaced only when the choices changed it, and never while being edited:
            # a value typed while this answer was on its way stays.
            "swap_spot_ratio": choices.spot_ratio_changed and changed != "spot_ratio",
            "volume_warning": _volume_warning(request, choices, params.get("volumes", "")),
        },
    )
    # The live estimate follows the resolved choices (GPUs per node may have changed).
    return trigger_client_event(response, "launch-choices-changed", after="settle")


LAUNCH_CHOICE_NAMES = ("gpu_type", "region", "gpus_per_node", "nodes", "spot_ratio", "image",
                       "cpus", "priority")  # fmt: skip


def _volume_warning(request: HttpRequest, choices: LaunchChoices, volumes_text) -> str:
    """Why the job's volumes can't be mounted where it runs (another region, a name that
    isn't a volume, one held by another job): the launch would refuse it."""
    if choices.region is None:
        return ""
    try:
        mounts = parse_volume_lines(volumes_text or "")
    except ValidationError:
        return ""  # the field's own error says it on submit
    return mount_problem(tenant=request.tenant, region=choices.region, mounts=mounts)


STATUS_LABELS = dict(JobStatus.choices)


def _shortened(text: str, length: int) -> str:
    """At most `length` characters, an ellipsis ending a cut (Truncator's result for
    plain text, without its per-call cost)."""
    return text if len(text) <= length else f"{text[: length - 1]}…"


def hardware_text(*, nodes: int, gpus_per_node: int, gpu_model: str | None, cpus: int) -> str:
    """ "8 × A100 80GB SXM", "2 nodes × 8 × H100 80GB SXM", "1 × 4 vCPU": GPU types by
    their display name, never their slug."""
    per_node = f"{gpus_per_node} × {gpu_model}" if gpu_model else f"{cpus} vCPU"
    return per_node if nodes == 1 else f"{nodes} nodes × {per_node}"


def job_list_rows(
    jobs: list[dict], costs: dict, expectations: dict[int, Expectation], currency: str = ""
) -> list[dict]:
    """What each row of the list shows, worked out once here (per-row URL reversing,
    choice labels and number formatting in the template were most of a 50-row page's
    time); the `job-row` partial of jobs/list.html writes it."""
    detail = reverse("jobs:detail", args=[0]).removesuffix("0/")
    now = timezone.now()
    names = catalog_names(
        gpu_type_ids={job["gpu_type_id"] for job in jobs},
        region_ids={job["region_id"] for job in jobs},
    )
    rows = []
    for job in jobs:
        gpu_type = names.gpu_types.get(job["gpu_type_id"]) if job["gpu_type_id"] else None
        hardware = hardware_text(
            nodes=job["nodes"],
            gpus_per_node=job["gpus_per_node"],
            gpu_model=gpu_type[1] if gpu_type else None,
            cpus=job["cpus"],
        )
        job_id = int(job["id"])
        rows.append(
            {
                "job": job,
                "id": str(job_id),
                "url": f"{detail}{job_id}/",
                "name": job["name"],
                "project": job["project"],
                "status": job["status"],
                "status_label": STATUS_LABELS.get(job["status"], job["status"]),
                "reason": _shortened(job["status_reason"], 60),
                "hardware": hardware,
                "gpus": bool(job["gpus_per_node"]),
                "running": job["status"] == JobStatus.RUNNING,
                "region": names.regions[job["region_id"]][1],
                "launched": naturaltime(job["created_at"]),
                "duration": duration_text(
                    job_run_seconds(selectors.job_from_row(job), now) if job["started_at"] else None
                ),
                "simulated": bool(job["pool_simulated"] or job["spot_pool_simulated"]),
                "cost": format_money(costs[job_id], currency),
                "expected": expectations[job_id].summary if job_id in expectations else "",
            }
        )
    return rows


@capability_required(Capability.VIEW_TENANT)
def job_list(request: HttpRequest) -> HttpResponse:
    status = request.GET.get("status", "")
    if status not in JobStatus.values:
        status = ""
    query = request.GET.get("q", "").strip()
    jobs = selectors.jobs_for_list_page(tenant=request.tenant, status=status, query=query)
    costs_provider = job_costs()
    # A page reads its rows as values, with what their costs need, in one query; it
    # counts the filtered jobs without those.
    rows_query = costs_provider.with_cost_inputs(
        selectors.list_page_rows(jobs, also=(*costs_provider.cost_columns, *EXPECTATION_COLUMNS))
    ).order_by(*Job._meta.ordering)
    paginator = CappedPaginator(rows_query, PAGE_SIZE, count_queryset=jobs)
    page = paginator.get_page(request.GET.get("page"))
    jobs_on_page = list(page)
    # Queued and running rows say when they start or end (a fixed number of queries).
    expectations = job_expectations(
        [selectors.job_from_row(row) for row in jobs_on_page if row["status"] in EXPECTED_STATUSES]
    )
    rows = job_list_rows(
        jobs_on_page,
        costs_provider.row_costs(jobs_on_page),
        expectations,
        currency=price_currency(),
    )
    context = {
        "page": page,
        "rows": rows,
        "status": status,
        "q": query,
        "statuses": JobStatus.choices,
    }
    if request.htmx and request.htmx.target == "job-table":
        return render(request, "jobs/list.html#job-table", context)
    return render(request, "jobs/list.html", context)


FAILURE_TAIL_LINES = 8


@capability_required(Capability.VIEW_TENANT)
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_for_tenant_or_404(
        Job.objects.select_related(
            "gpu_type", "region", "image", "created_by", "pool", "spot_pool"
        ),
        request.tenant,
        pk=job_id,
    )
    events = list(selectors.job_events(job=job))
    context = {
        "job": job,
        "events": events,
        "cost": job_costs().costs_to_date([job])[job.pk],
        "run_rate": job_costs().run_rate(job),
        "run_time": job_run_seconds(job, timezone.now()) if job.started_at else None,
        "currency": price_currency(),
        "queue_position": selectors.queue_position(job),
        "expectation": job_expectations([job])[job.pk],
        "isolation_note": selectors.job_isolation_note(job),
        "can_launch": has_capability(request.membership, Capability.LAUNCH_JOBS),
        "can_act": may_act_on_job(request.membership, job),
        "logs_url": reverse("api-job-logs", args=[job.pk]),
        "metrics_url": reverse("api-job-metrics", args=[job.pk]),
        "monitor_url": reverse("api-job-monitor", args=[job.pk]),
        "download_url": reverse("api-job-log-download", args=[job.pk]),
        # "rank 0: exit code 1" alone doesn't say why: the error is in the last lines.
        "failure_tail": (
            tail_lines(job, FAILURE_TAIL_LINES)[0] if job.status == JobStatus.FAILED else []
        ),
    }
    if request.htmx and request.htmx.target in ("job-status", "job-cost"):
        return render(request, f"jobs/detail.html#{request.htmx.target}", context)
    # Read from the store: on the full page and its own (slower) refresh only.
    context["checkpoints"] = selectors.job_checkpoints(job=job)
    if request.htmx and request.htmx.target == "job-checkpoints":
        return render(request, "jobs/detail.html#job-checkpoints", context)
    context["metric_charts"] = [(field, title) for field, title, _unit in metrics.CHARTS]
    context["volumes"] = volume_provider().mounts_for(job)
    return render(request, "jobs/detail.html", context)


ACTIONS = {
    "pause": services.job_pause,
    "resume": services.job_resume,
    "cancel": services.job_cancel,
}


@capability_required(Capability.LAUNCH_JOBS)
@require_http_methods(["GET", "POST"])
def job_clone(request: HttpRequest, job_id: int) -> HttpResponse:
    """A one-click clone asks first, saying what it launches and what that costs; "Edit
    first" opens the launch form filled from the job instead."""
    job = get_for_tenant_or_404(Job, request.tenant, pk=job_id)
    job_action_check(request.membership, job)
    per_node = (
        f"{job.gpus_per_node} {job.gpu_type} GPU{pluralize(job.gpus_per_node)}"
        if job.gpu_type_id
        else f"{job.cpus} vCPU{pluralize(job.cpus)}"
    )
    hardware = f"{job.nodes} node{pluralize(job.nodes)} × {per_node}"
    rate = job_costs().run_rate(job)
    book = price_book()
    details = [
        f"{hardware} in {job.region.name}"
        + (
            f" ({job.spot_nodes} spot, {job.on_demand_nodes} on-demand nodes)"
            if job.spot_nodes
            else ""
        ),
        f"Image {job.image_reference}, command {' '.join(job.command)}"[:300],
        f"Up to {job.max_runtime_minutes} minutes of running time",
    ]
    if rate is not None and book is not None:
        details.append(
            f"About {format_money(rate, book.version.currency)} per hour while it runs, "
            "at today's prices"
        )
    launch_url = reverse("jobs:launch") + f"?from={job.pk}"
    clone_name = f"{job.name} (clone)"[:100]
    # "Clone from checkpoint" (the Checkpoints section): the clone's first start continues
    # from this job's latest complete checkpoint (the form posts back to this URL).
    from_checkpoint = request.GET.get("from_checkpoint") == "1"
    if from_checkpoint:
        details.append("Its first start continues from this job's latest complete checkpoint")

    return confirm_then_act(
        request,
        title=f"Launch a clone of “{job.name}”"
        + (" from its checkpoint?" if from_checkpoint else "?"),
        message=f"“{clone_name}” is launched at once with the same settings:",
        details=details,
        confirm_label="Launch clone",
        danger=False,
        alternative=("Edit first", launch_url),
        act=lambda: services.job_clone(
            job=job, user=request.user, request=request, from_checkpoint=from_checkpoint
        ),
        success_url=lambda clone: reverse("jobs:detail", args=[clone.pk]),
        success_message=f"Cloned as “{clone_name}”.",
        cancel_url=reverse("jobs:detail", args=[job.pk]),
    )


@capability_required(Capability.LAUNCH_JOBS)
@require_POST
def job_action(request: HttpRequest, job_id: int, action: str) -> HttpResponse:
    job = get_for_tenant_or_404(Job, request.tenant, pk=job_id)
    if action not in ACTIONS:
        return HttpResponse(status=404)
    job_action_check(request.membership, job)
    try:
        ACTIONS[action](job=job, actor=Actor.of_user(request.user))
        messages.success(request, f"{action.title()} requested for “{job.name}”.")
        target = reverse("jobs:detail", args=[job.pk])
    except ServiceError as error:
        messages.error(request, error.message)
        target = reverse("jobs:detail", args=[job.pk])
    if request.htmx:
        return HttpResponseClientRedirect(target)
    return redirect(target)


@capability_required(Capability.LAUNCH_JOBS)
@require_POST
def template_save(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_for_tenant_or_404(Job, request.tenant, pk=job_id)
    name = request.POST.get("name", "")
    # Saving under a taken name replaces that template: a change of someone's template.
    replaced = LaunchTemplate.objects.for_tenant(request.tenant).filter(name=name.strip()).first()
    if replaced is not None:
        template_change_check(request.membership, replaced)
    try:
        template = services.launch_template_save(
            job=job, name=name, user=request.user, request=request
        )
    except ServiceError as error:
        messages.error(request, error.message)
    else:
        messages.success(
            request, f"Saved as template “{template.name}”; find it on the Launch page."
        )
    return redirect("jobs:detail", job_id=job.pk)


@capability_required(Capability.LAUNCH_JOBS)
@require_http_methods(["GET", "POST"])
def template_delete(request: HttpRequest, template_id: int) -> HttpResponse:
    template = get_for_tenant_or_404(LaunchTemplate, request.tenant, pk=template_id)
    template_change_check(request.membership, template)
    return confirm_then_act(
        request,
        title="Delete template",
        message=f"Delete the launch template “{template.name}”?",
        confirm_label="Delete",
        act=lambda: services.launch_template_delete(
            template=template, user=request.user, request=request
        ),
        success_url=reverse("jobs:launch"),
        success_message=f"Template “{template.name}” deleted.",
        cancel_url=reverse("jobs:launch"),
    )


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET", "POST"])
def secrets(request: HttpRequest) -> HttpResponse:
    """Organisation secrets: names visible to members, values never shown; admins edit."""
    can_manage = has_capability(request.membership, Capability.MANAGE_SECRETS)
    form = TenantSecretForm(request.POST or None)
    if request.method == "POST":
        if not can_manage:
            raise Http404("Not found.")
        if form.is_valid():
            try:
                secret = services.tenant_secret_set(
                    tenant=request.tenant, user=request.user, request=request, **form.cleaned_data
                )
            except ServiceError as error:
                add_service_error(form, error)
            else:
                messages.success(
                    request, f"Secret {secret.name} saved; its value won't be shown again."
                )
                return redirect("jobs:secrets")
    return render(
        request,
        "jobs/secrets.html",
        {
            "form": form,
            "can_manage": can_manage,
            "secrets": TenantSecret.objects.for_tenant(request.tenant).select_related("created_by"),
            "registry_credentials": registry_credentials_for_tenant(tenant=request.tenant),
        },
    )


@capability_required(Capability.MANAGE_SECRETS)
@require_http_methods(["GET", "POST"])
def secret_delete(request: HttpRequest, secret_id: int) -> HttpResponse:
    secret = get_for_tenant_or_404(TenantSecret, request.tenant, pk=secret_id)
    return confirm_then_act(
        request,
        title="Delete secret",
        message=f"Delete {secret.name}? New launches that name it will be refused; running "
        "jobs keep the copy they started with.",
        confirm_label="Delete",
        act=lambda: services.tenant_secret_delete(
            secret=secret, user=request.user, request=request
        ),
        success_url=reverse("jobs:secrets"),
        success_message=f"Secret {secret.name} deleted.",
        cancel_url=reverse("jobs:secrets"),
    )


@capability_required(Capability.LAUNCH_JOBS)
@require_http_methods(["GET", "POST"])
def job_delete(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_for_tenant_or_404(Job, request.tenant, pk=job_id)
    job_action_check(request.membership, job)
    return confirm_then_act(
        request,
        title="Delete job",
        message=f"Delete “{job.name}” and its timeline? Its usage stays on your bill.",
        confirm_label="Delete",
        act=lambda: services.job_delete(job=job, user=request.user, request=request),
        success_url=reverse("jobs:list"),
        success_message=f"“{job.name}” deleted.",
        # A refused delete (the job isn't finished) goes back to the job, with the reason.
        cancel_url=reverse("jobs:detail", args=[job.pk]),
    )


@staff_required
def staff_fleet(request: HttpRequest) -> HttpResponse:
    """Staff's landing page: pools used and free as admission counts them, who holds
    compute, the queue by what it waits for, and the panels other rooms add."""
    pools = fleet.fleet_pools()
    queue = fleet.fleet_queue()
    suspect = SuspectNode.objects.select_related("pool")
    return render(
        request,
        "jobs/staff_fleet.html",
        {
            "pools": pools,
            "gpus_held": sum(p.held for p in pools if p.unit == "GPUs"),
            "gpus_total": sum(p.capacity for p in pools if p.unit == "GPUs"),
            "tenants": fleet.fleet_tenants()[:50],
            "queue": queue,
            "queued_total": sum(n for _, n in queue),
            "suspect_nodes": suspect,
            "panels": [
                render_to_string(panel.template_name, panel.context, request=request)
                for panel in fleet_panels()
            ],
        },
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_node_healthy(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(SuspectNode, pk=node_id)
    return confirm_then_act(
        request,
        title=f"Mark {node.name} healthy?",
        message=f"It was marked suspect on {node.marked_at:%Y-%m-%d %H:%M}: {node.reason}. "
        "Its GPUs count toward capacity again from the next sync and jobs may land on it"
        + (", and it is uncordoned on the cluster." if node.cordoned else "."),
        confirm_label="Mark healthy",
        act=lambda: repair.node_healthy(node=node, user=request.user, request=request),
        success_url=reverse("jobs:staff_fleet"),
        success_message=f"{node.name} counts as healthy again.",
        cancel_url=reverse("jobs:staff_fleet"),
    )
