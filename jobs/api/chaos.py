"""Staff API of the sandbox cluster's chaos controls (see jobs.services.chaos)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.schema import ErrorSerializer
from console.permissions import IsPlatformStaffElseNotFound
from jobs.services import chaos
from marketplace.models import NodePool


class ApiFaultsSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(choices=chaos.API_FAULT_MODES)
    fraction = serializers.FloatField(min_value=0.01, max_value=1)
    seconds = serializers.FloatField(min_value=1, max_value=3600)
    delay = serializers.FloatField(min_value=0.1, max_value=30, default=2.0)


class ChaosView(APIView):
    permission_classes = [IsPlatformStaffElseNotFound]


class SandboxNodesView(ChaosView):
    @extend_schema(
        responses={
            200: inline_serializer(
                "SandboxNodes",
                fields={"nodes": serializers.ListField(child=serializers.DictField())},
            ),
            409: ErrorSerializer,  # no sandbox cluster runs
        }
    )
    def get(self, request):
        return Response({"nodes": chaos.chaos_nodes()})


class SandboxReclaimSpotView(ChaosView):
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, pool_slug: str):
        pool = get_object_or_404(NodePool, slug=pool_slug)
        return Response(chaos.chaos_reclaim_spot(pool=pool, request=request._request))


class SandboxNodeFailView(ChaosView):
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, node: str):
        return Response(chaos.chaos_node_fail(node=node, request=request._request))


class SandboxNodeRecoverView(ChaosView):
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, node: str):
        return Response(chaos.chaos_node_recover(node=node, request=request._request))


class XidErrorSerializer(serializers.Serializer):
    code = serializers.IntegerField(
        min_value=1,
        max_value=999,
        default=79,
        help_text="The XID error number (79: the GPU has fallen off the bus; 48: a "
        "double-bit ECC error).",
    )


class SandboxNodeXidView(ChaosView):
    @extend_schema(request=XidErrorSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, node: str):
        data = XidErrorSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(
            chaos.chaos_xid_error(
                node=node, code=data.validated_data["code"], request=request._request
            )
        )


class SandboxNodeStuckView(ChaosView):
    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, node: str):
        return Response(chaos.chaos_stuck_gpus(node=node, request=request._request))


class SandboxApiFaultsView(ChaosView):
    @extend_schema(request=ApiFaultsSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        data = ApiFaultsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(chaos.chaos_api_faults(request=request._request, **data.validated_data))

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def delete(self, request):
        return Response(chaos.chaos_api_faults_clear(request=request._request))
