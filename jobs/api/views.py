"""Jobs API: launch, list, inspect, act. Thin over jobs.services / jobs.selectors."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from console.api.base import TenantScopedViewSet
from console.api.pagination import CursorCountPagination, EventCursorPagination
from console.api.params import query_params
from console.api.schema import ErrorSerializer
from console.permissions import Capability, IsTenantMember, MayActOnJob
from jobs import selectors, services
from jobs.actors import Actor
from jobs.api import serializers as s
from jobs.extensions import job_costs
from jobs.logs.reading import read_lines
from jobs.models import Job, TenantSecret
from jobs.selectors import SIMULATED_POOLS


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = Job.objects.select_related("gpu_type", "region", "image", "tenant")
    serializer_class = s.JobSerializer
    pagination_class = CursorCountPagination
    # Acting on a job (get_object of a POST or DELETE) also depends on whose it is.
    permission_classes = [IsTenantMember, MayActOnJob]
    required_capabilities = {
        a: Capability.LAUNCH_JOBS
        for a in ("create", "pause", "resume", "cancel", "clone", "destroy")
    }

    def scope_queryset(self, queryset):
        if self.action == "list":  # a row's columns and slugs, its cost's inputs
            status = query_params(s.JobQuerySerializer, self.request).get("status")
            if status:
                queryset = queryset.filter(status=status)
            return s.listed_jobs(queryset.select_related(None))
        if self.action == "retrieve":  # its cost's inputs and pools' kind read with the job
            # (its GPU type's and region's slugs are the catalog's names: fewer joins to plan)
            related = queryset.select_related(None).select_related("image", "tenant")
            return job_costs().with_cost_inputs(related.annotate(**SIMULATED_POOLS))
        return queryset

    @extend_schema(parameters=[s.JobQuerySerializer])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(
        request=s.JobCreateSerializer,
        responses={201: s.JobSerializer, 402: ErrorSerializer},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
    )
    def create(self, request, *args, **kwargs):
        data = s.JobCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = request.headers.get("Idempotency-Key", "").strip()[:200] or None
        job = services.job_submit(
            tenant=request.tenant,
            user=request.user,
            spec=data.to_spec(),
            idempotency_key=key,
            request=request._request,
        )
        return Response(s.JobSerializer(job).data, status=status.HTTP_201_CREATED)

    def _act(self, service, **kwargs):
        job = service(job=self.get_object(), actor=Actor.of_user(self.request.user), **kwargs)
        return Response(s.JobSerializer(job).data)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        return self._act(services.job_pause)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._act(services.job_resume)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return self._act(services.job_cancel)

    @extend_schema(
        request=s.JobCloneSerializer,
        responses={201: s.JobSerializer, 402: ErrorSerializer, 409: ErrorSerializer},
    )
    @action(detail=True, methods=["post"])
    def clone(self, request, pk=None):
        data = s.JobCloneSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = services.job_clone(
            job=self.get_object(),
            user=request.user,
            request=request._request,
            from_checkpoint=data.validated_data["from_checkpoint"],
        )
        return Response(s.JobSerializer(job).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        services.job_delete(job=self.get_object(), user=request.user, request=request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=s.JobEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        events = selectors.job_events(job=self.get_object())
        paginator = EventCursorPagination()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response(s.JobEventSerializer(page, many=True).data)

    @extend_schema(responses=s.JobCheckpointsSerializer)
    @action(detail=True, methods=["get"])
    def checkpoints(self, request, pk=None):
        """The job's complete checkpoints, newest first, and where each later start
        resumed from (with the work lost)."""
        job = self.get_object()
        found = selectors.job_checkpoints(job=job)
        return Response(s.JobCheckpointsSerializer(found, context={"job": job}).data)

    @extend_schema(parameters=[s.LogQuerySerializer], responses=s.LogPageSerializer)
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        job = self.get_object()
        params = query_params(s.LogQuerySerializer, request)
        since = max(0, params["since_line"])
        limit = min(5000, max(1, params["limit"]))
        # Masked secret values, a read time per line, archived logs after the job ends.
        return Response(read_lines(job, since_line=since, limit=limit))


class TenantSecretViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, TenantScopedViewSet
):
    """Organisation secrets: every member sees names and where each may be used; those
    who manage secrets set and delete them. Values are write-only."""

    queryset = TenantSecret.objects.select_related("created_by")
    serializer_class = s.TenantSecretSerializer
    required_capabilities = {a: Capability.MANAGE_SECRETS for a in ("create", "destroy")}

    @extend_schema(request=s.TenantSecretSetSerializer, responses={201: s.TenantSecretSerializer})
    def create(self, request, *args, **kwargs):
        data = s.TenantSecretSetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        secret = services.tenant_secret_set(
            tenant=request.tenant,
            user=request.user,
            request=request._request,
            **data.validated_data,
        )
        return Response(s.TenantSecretSerializer(secret).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        services.tenant_secret_delete(
            secret=self.get_object(), user=request.user, request=request._request
        )
        return Response(status=status.HTTP_204_NO_CONTENT)
