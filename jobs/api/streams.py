"""Job log download, GPU metrics, monitoring and self-repair choices over the API (and
for the job page's scripts). Thin over jobs.logs / jobs.metrics / jobs.alerts; every job is
reached through the tenant scope, so another tenant's job is a 404."""

from __future__ import annotations

from datetime import timedelta

from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.fields import StrictBooleanField, StrictCharField
from console.api.params import query_params
from console.charts import GPU_TYPE_PALETTE
from console.permissions import Capability, IsTenantMember, MayActOnJob
from console.tenancy import get_for_tenant_or_404
from jobs import alerts, metrics
from jobs.logs.reading import adownload_chunks
from jobs.models import Job, JobAlert, JobMonitor
from marketplace.selectors import gpu_type_colours


class JobView(APIView):
    required_capabilities: dict = {}
    # A write (the auto-stop that pauses the job) is an action on the job.
    permission_classes = [IsTenantMember, MayActOnJob]

    def initial(self, request, *args, **kwargs):
        # console.permissions.IsTenantMember reads per-action capabilities from `action`.
        self.action = request.method.lower()
        super().initial(request, *args, **kwargs)

    def job(self, pk: int) -> Job:
        job = get_for_tenant_or_404(Job, self.request.tenant, pk=pk)
        self.check_object_permissions(self.request, job)
        return job


class JobLogDownloadView(JobView):
    """The job's whole log as text (secret values masked)."""

    @extend_schema(responses={(200, "text/plain"): bytes})
    def get(self, request, pk: int):
        job = self.job(pk)
        response = StreamingHttpResponse(
            adownload_chunks(job), content_type="text/plain; charset=utf-8"
        )
        response["Content-Disposition"] = f'attachment; filename="job-{job.pk}.log"'
        return response


class MetricSampleSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    node = StrictCharField()
    gpu = serializers.IntegerField()
    utilization = serializers.FloatField(allow_null=True)
    memory_used_mib = serializers.FloatField(allow_null=True)
    memory_total_mib = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)
    temperature_c = serializers.FloatField(allow_null=True)


class ChartMarkerSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    label = StrictCharField(help_text='"Paused", "Resumed" or "Preempted".')


class JobMetricsSerializer(serializers.Serializer):
    samples = MetricSampleSerializer(many=True)
    figures = serializers.DictField(help_text="Plotly figures (JSON) per chart, built here.")
    note = StrictCharField(help_text='Why there are no readings (e.g. "no GPU"), or "".')
    markers = ChartMarkerSerializer(
        many=True, help_text="Pauses, resumes and preemptions in the range, as charted."
    )
    summary = serializers.DictField()
    alerts = serializers.ListField(child=serializers.DictField())


class MetricsQuerySerializer(serializers.Serializer):
    since = serializers.DateTimeField(
        required=False, help_text="ISO 8601; without a zone, UTC. Default: 15 minutes ago."
    )


class JobMetricsView(JobView):
    """GPU samples of a job since `since` (ISO 8601; default: the last 15 minutes):
    raw for the last hour, 1-minute means before."""

    @extend_schema(parameters=[MetricsQuerySerializer], responses=JobMetricsSerializer)
    def get(self, request, pk: int):
        job = self.job(pk)
        since = query_params(MetricsQuerySerializer, request).get("since") or (
            timezone.now() - timedelta(minutes=15)
        )
        recent_alerts = JobAlert.objects.filter(job=job).order_by("-at")[:20]
        samples = metrics.job_samples(job=job, since=since)
        markers = metrics.job_markers(job=job, since=since)
        slug = job.gpu_type.slug if job.gpu_type_id else ""
        colour = gpu_type_colours().get(slug, GPU_TYPE_PALETTE[0])
        return Response(
            {
                "samples": samples,
                "figures": metrics.job_figures(samples, colour=colour, markers=markers),
                "markers": markers,
                "note": metrics.metrics_note(job),
                "summary": metrics.job_summary(job=job),
                "alerts": [
                    {
                        "kind": a.kind,
                        "severity": a.severity,
                        "message": a.message,
                        "at": a.at.isoformat(),
                    }
                    for a in recent_alerts
                ],
            }
        )


def _own_choice(what: str) -> StrictBooleanField:
    return StrictBooleanField(
        required=False,
        allow_null=True,
        help_text=f"{what}: true or false is this job's own choice; null follows the "
        "organisation's default (GET /api/v1/organisation/settings); left out of a PUT, "
        "unchanged.",
    )


class JobMonitorSerializer(serializers.Serializer):
    """What PUT sets. A null self-repair choice follows the organisation's current
    default, so a change of the default reaches the job."""

    idle_auto_stop = StrictBooleanField()
    idle_minutes = serializers.IntegerField(min_value=1, max_value=7 * 24 * 60, allow_null=True)
    loss_explosion_pause = _own_choice(
        "Pause the job when a logged loss explodes (above the run's mean + 3σ, or NaN)"
    )
    hardware_repair = _own_choice(
        "Checkpoint the job and requeue it on another node when one of its GPUs reports a "
        "hardware fault (XID error) or one of its ranks is stuck; off, the job is alerted "
        "and its node marked suspect but it keeps running"
    )


class SelfRepairInEffectSerializer(serializers.Serializer):
    loss_explosion_pause = StrictBooleanField()
    hardware_repair = StrictBooleanField()


class JobMonitorAnswerSerializer(JobMonitorSerializer):
    """The job's choices as set, and what self-repair does for it now."""

    in_effect = SelfRepairInEffectSerializer(
        help_text="What self-repair does for the job now: its own choice, else its "
        "organisation's default."
    )


def _monitor_answer(job: Job, monitor: JobMonitor | None) -> dict:
    choices = alerts.self_repair_choices(job=job, monitor=monitor)
    return {
        "idle_auto_stop": bool(monitor and monitor.idle_auto_stop),
        "idle_minutes": monitor.idle_minutes if monitor else None,
        "loss_explosion_pause": monitor.loss_explosion_pause if monitor else None,
        "hardware_repair": monitor.hardware_repair if monitor else None,
        "in_effect": {
            "loss_explosion_pause": choices.loss_explosion_pause,
            "hardware_repair": choices.hardware_repair,
        },
    }


class JobMonitorView(JobView):
    """The job's self-repair choices: pause it when its GPUs stay idle or its logged loss
    explodes; move it off a node with a hardware fault."""

    required_capabilities = {"put": Capability.LAUNCH_JOBS}

    @extend_schema(responses=JobMonitorAnswerSerializer)
    def get(self, request, pk: int):
        job = self.job(pk)
        return Response(_monitor_answer(job, JobMonitor.objects.filter(job=job).first()))

    @extend_schema(request=JobMonitorSerializer, responses=JobMonitorAnswerSerializer)
    def put(self, request, pk: int):
        job = self.job(pk)
        data = JobMonitorSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(
            _monitor_answer(job, alerts.job_monitor_set(job=job, **data.validated_data))
        )
