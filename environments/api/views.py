"""Environments API: thin over environments.services / environments.selectors."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from console.api.base import TenantScopedViewSet
from console.api.schema import ErrorSerializer
from console.permissions import Capability
from environments import services
from environments.api import serializers as s
from environments.models import Environment

KEEP_VOLUME = OpenApiParameter(
    "keep_volume", OpenApiTypes.BOOL, required=True,
    description="Keep the home volume (true) or delete it with its files (false)",
)  # fmt: skip


class EnvironmentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The organisation's dev environments, by name. Every member sees them; members who
    launch jobs create them and use their own, owners and admins any."""

    queryset = Environment.objects.all()
    serializer_class = s.EnvironmentSerializer
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
    required_capabilities = {
        a: Capability.LAUNCH_JOBS
        for a in ("create", "update", "partial_update", "destroy", "start", "stop", "keep_alive")
    }

    def scope_queryset(self, queryset):
        return queryset.select_related(
            "tenant", "region", "gpu_type", "home_volume", "current_job"
        ).order_by("name", "pk")

    def get_object(self):
        return services.environment_sync(environment=super().get_object())

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        for environment in page or []:
            services.environment_sync(environment=environment)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(
        request=s.EnvironmentCreateSerializer,
        responses={201: s.EnvironmentSerializer, 400: ErrorSerializer, 409: ErrorSerializer},
    )
    def create(self, request, *args, **kwargs):
        """Create a stopped environment (and its home volume unless one is named)."""
        data = s.EnvironmentCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        environment = services.environment_create(
            tenant=request.tenant, user=request.user, request=request._request, **data.changes()
        )
        return Response(
            s.EnvironmentSerializer(environment, context={"request": request}).data,
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(
        request=s.EnvironmentUpdateSerializer,
        responses={200: s.EnvironmentSerializer, 400: ErrorSerializer, 403: ErrorSerializer},
    )
    def partial_update(self, request, *args, **kwargs):
        """Change its spec; it applies from the next start."""
        data = s.EnvironmentUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        environment = services.environment_update(
            environment=self.get_object(),
            user=request.user,
            changes=data.changes(),
            request=request._request,
        )
        return Response(s.EnvironmentSerializer(environment, context={"request": request}).data)

    @extend_schema(
        parameters=[KEEP_VOLUME],
        responses={204: None, 400: ErrorSerializer, 403: ErrorSerializer, 409: ErrorSerializer},
    )
    def destroy(self, request, *args, **kwargs):
        """Delete a stopped environment; `keep_volume` says whether its home volume stays."""
        environment = self.get_object()  # first: another organisation's is a 404
        answer = request.query_params.get("keep_volume")
        if answer not in ("true", "false"):
            raise ValidationError(
                {"keep_volume": ["Say whether to keep the home volume: true or false."]}
            )
        services.environment_delete(
            environment=environment,
            user=request.user,
            keep_volume=answer == "true",
            request=request._request,
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=None,
        responses={200: s.EnvironmentSerializer, 400: ErrorSerializer, 409: ErrorSerializer},
    )
    @action(detail=True, methods=["post"])
    def start(self, request, *args, **kwargs):
        """Start it as a new job (409 when it runs, or its home volume is held)."""
        environment = services.environment_start(
            environment=self.get_object(), user=request.user, request=request._request
        )
        return Response(s.EnvironmentSerializer(environment, context={"request": request}).data)

    @extend_schema(request=None, responses={200: s.EnvironmentSerializer, 409: ErrorSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, *args, **kwargs):
        """Stop its job; the home volume stays (409 when it is stopped)."""
        environment = services.environment_stop(
            environment=self.get_object(), user=request.user, request=request._request
        )
        return Response(s.EnvironmentSerializer(environment, context={"request": request}).data)

    @extend_schema(
        request=s.KeepAliveSerializer,
        responses={200: s.EnvironmentSerializer, 400: ErrorSerializer, 409: ErrorSerializer},
    )
    @action(detail=True, methods=["post"], url_path="keep-alive")
    def keep_alive(self, request, *args, **kwargs):
        """Count as activity for the idle rule, now or for `minutes` (ends an idle
        warning); 409 when it isn't running."""
        environment = self.get_object()  # first: another organisation's is a 404
        data = s.KeepAliveSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        environment = services.environment_keep_alive(
            environment=environment, user=request.user, minutes=data.validated_data["minutes"]
        )
        return Response(s.EnvironmentSerializer(environment, context={"request": request}).data)
