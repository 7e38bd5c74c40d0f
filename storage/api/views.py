"""Volumes API: thin over storage.services / storage.selectors."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from console.api.base import TenantScopedViewSet
from console.api.schema import ErrorSerializer
from console.permissions import Capability
from storage import selectors, services
from storage.api import serializers as s
from storage.models import Volume


class VolumeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The organisation's volumes: every member sees them; those who launch jobs create,
    grow and delete them."""

    queryset = Volume.objects.select_related("region")
    serializer_class = s.VolumeSerializer
    required_capabilities = {
        a: Capability.LAUNCH_JOBS
        for a in ("create", "update", "partial_update", "destroy", "fill", "fill_cancel")
    }

    def scope_queryset(self, queryset):
        return selectors.with_latest_fill(queryset.filter(deleted_at=None).order_by("name", "pk"))

    @extend_schema(
        request=s.VolumeCreateSerializer,
        responses={201: s.VolumeSerializer, 400: ErrorSerializer, 409: ErrorSerializer},
    )
    def create(self, request, *args, **kwargs):
        data = s.VolumeCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        volume = services.volume_create(
            tenant=request.tenant,
            user=request.user,
            request=request._request,
            **data.validated_data,
        )
        return Response(s.VolumeSerializer(volume).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=s.VolumeResizeSerializer,
        responses={200: s.VolumeSerializer, 400: ErrorSerializer},
    )
    def partial_update(self, request, *args, **kwargs):
        """Grow the volume (volumes never shrink)."""
        volume = self.get_object()
        data = s.VolumeResizeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        volume = services.volume_resize(
            volume=volume,
            user=request.user,
            size_gib=data.validated_data["size_gib"],
            request=request._request,
        )
        return Response(s.VolumeSerializer(volume).data)

    @extend_schema(responses={204: None, 409: ErrorSerializer})
    def destroy(self, request, *args, **kwargs):
        """Delete the volume and its data; 409 while a job that isn't finished mounts it."""
        services.volume_delete(
            volume=self.get_object(), user=request.user, request=request._request
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=s.VolumeFillStartSerializer,
        responses={202: s.VolumeSerializer, 400: ErrorSerializer, 409: ErrorSerializer},
    )
    @action(detail=True, methods=["post"])
    def fill(self, request, *args, **kwargs):
        """Fill the volume from an http(s):// URL or s3://bucket/prefix: a copy the
        console runs; its progress is the volume's `fill`. 409 while another fill runs
        or a job that isn't finished mounts the volume read-write."""
        volume = self.get_object()
        data = s.VolumeFillStartSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.volume_fill_start(
            volume=volume, user=request.user, request=request._request, **data.validated_data
        )
        return Response(s.VolumeSerializer(self.get_object()).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: s.VolumeSerializer, 409: ErrorSerializer})
    @action(detail=True, methods=["post"], url_path="fill/cancel")
    def fill_cancel(self, request, *args, **kwargs):
        """Cancel the running fill; what it copied is discarded. 409 when none runs."""
        volume = self.get_object()
        services.volume_fill_cancel(volume=volume, user=request.user, request=request._request)
        return Response(s.VolumeSerializer(self.get_object()).data)
