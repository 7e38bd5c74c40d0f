"""Marketplace API: catalog reads for every member, estimates, staff-only writes."""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.base import TenantScopedViewSet
from console.api.params import query_params
from console.permissions import (
    Capability,
    IsPlatformStaff,
    IsPlatformStaffElseNotFound,
    IsTenantMember,
)
from console.service_errors import ServiceError
from marketplace import selectors, services
from marketplace.api import serializers as s
from marketplace.models import (
    GpuType,
    Image,
    NodePool,
    PriceEntry,
    PriceVersion,
    RegistryCredential,
)
from marketplace.pricing import PricingError, estimate_cost
from marketplace.recommend import Precision, Workload, gpu_recommendations


class GpuTypeViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = GpuType.objects.filter(is_active=True)
    serializer_class = s.GpuTypeSerializer
    lookup_field = "slug"
    # Staff first: a staff automation token (no organisation) reads the catalog too.
    permission_classes = [IsPlatformStaff | IsTenantMember]


class RegionViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = s.RegionSerializer
    lookup_field = "slug"
    # Staff first: a staff automation token (no organisation) reads the catalog too.
    permission_classes = [IsPlatformStaff | IsTenantMember]

    def get_queryset(self):
        # The regions the caller may choose, as the launch form and offers show them:
        # "This host" only for organisations staff allowed there (a 404 for the rest).
        return selectors.regions_for_tenant(getattr(self.request, "tenant", None))


class OfferViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = s.OfferSerializer

    @extend_schema(parameters=[s.OfferQuerySerializer])
    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.offer_rows(page))

    def get_queryset(self):
        params = query_params(s.OfferQuerySerializer, self.request)
        return selectors.offers(
            tenant=self.request.tenant,
            vendor=params["vendor"] or None,
            gpu_type=params["gpu_type"] or None,
            min_memory_gib=params.get("min_memory_gib"),
            region=params["region"] or None,
            tier=params["tier"] or None,
            available_only=params["available"],
            include_cpu=params["include_cpu"],
            sort=params["sort"],
            interconnect=params.get("interconnect"),
            cpu_arch=params.get("cpu_arch"),
        )


class EstimateView(APIView):
    @extend_schema(request=s.EstimateRequestSerializer, responses=s.EstimateSerializer)
    def post(self, request):
        data = s.EstimateRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        if not selectors.regions_for_tenant(request.tenant).filter(pk=values["region"].pk).exists():
            raise ServiceError(selectors.HOST_NOT_AVAILABLE, field="region")
        try:
            result = estimate_cost(
                gpu_type=values.get("gpu_type"),
                region=values["region"],
                nodes=values["nodes"],
                gpus_per_node=values.get("gpus_per_node", 0),
                cpus=values.get("cpus") or 0,
                spot_ratio=values["spot_ratio"],
                hours=values["hours"],
                tier=values["tier"],
                reserved_months=int(values["reserved_months"]),
                tenant=request.tenant,
            )
        except PricingError as error:
            raise ServiceError(error.message, field=error.field) from None
        return Response(s.EstimateSerializer(result).data)


class RecommendationView(APIView):
    """The GPU recommender: the memory a model needs for a workload and the catalog's
    configurations that hold it, fitting ones first, then cheapest (the caller's prices)."""

    @extend_schema(
        request=s.RecommendationRequestSerializer,
        responses=s.RecommendationSerializer,
        description="Sizes in GiB. `fits`: the pools have enough nodes for the "
        "configuration, keeping `memory_margin` of each GPU's memory in reserve; "
        "`available_now`: enough of their GPUs are free at this moment.",
    )
    def post(self, request):
        data = s.RecommendationRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        region = values["region"]
        if region is not None and not (
            selectors.regions_for_tenant(request.tenant).filter(pk=region.pk).exists()
        ):
            raise ServiceError(selectors.HOST_NOT_AVAILABLE, field="region")
        recommendation = gpu_recommendations(
            tenant=request.tenant,
            parameters_billion=float(values["parameters_billion"]),
            workload=Workload(values["workload"]),
            precision=Precision(values["precision"]),
            sequence_length=values["sequence_length"],
            batch_size=values["batch_size"],
            tier=values["tier"],
            region=region,
            layers=values.get("layers"),
            hidden_size=values.get("hidden_size"),
            kv_heads=values.get("kv_heads"),
            head_dim=values.get("head_dim"),
            lora_rank=values["lora_rank"],
        )
        return Response(s.RecommendationSerializer(recommendation).data)


class ImageViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    TenantScopedViewSet,
):
    """Public images and the tenant's private ones; admins add and retire private images."""

    queryset = Image.objects.filter(is_active=True)
    serializer_class = s.ImageSerializer
    required_capabilities = {
        "create": Capability.MANAGE_PRIVATE_IMAGES,
        "destroy": Capability.MANAGE_PRIVATE_IMAGES,
    }

    def scope_queryset(self, queryset):
        if self.action == "destroy":
            return queryset.owned_by(self.request.tenant)
        if self.action != "list":
            return selectors.images_for_tenant(tenant=self.request.tenant)
        params = query_params(s.ImageQuerySerializer, self.request)
        return selectors.images_for_tenant(
            tenant=self.request.tenant,
            query=params["q"],
            kind=params["kind"],
            vendor=params["vendor"],
            interactive=params["interactive"],
        )

    @extend_schema(parameters=[s.ImageQuerySerializer])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(request=s.ImageCreateSerializer, responses={201: s.ImageSerializer})
    def create(self, request, *args, **kwargs):
        data = s.ImageCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        image = services.image_create(
            tenant=request.tenant,
            slug=values.pop("slug"),
            reference=values.pop("reference"),
            user=request.user,
            request=request._request,
            **values,
        )
        return Response(s.ImageSerializer(image).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        responses={200: s.ImageSerializer},
        description="Retires the image: it answers with is_active false, and is gone from "
        "the list and from GET.",
    )
    def destroy(self, request, *args, **kwargs):
        image = services.image_deactivate(
            image=self.get_object(), user=request.user, request=request._request
        )
        return Response(s.ImageSerializer(image).data)


class RegistryCredentialViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    TenantScopedViewSet,
):
    """The tenant's logins to allow-listed registries, for pulling its private images.
    Members see which registries have one; admins add (or replace: one per registry) and
    remove them. Passwords are never returned."""

    queryset = RegistryCredential.objects.select_related("created_by")
    serializer_class = s.RegistryCredentialSerializer
    required_capabilities = {
        "create": Capability.MANAGE_PRIVATE_IMAGES,
        "destroy": Capability.MANAGE_PRIVATE_IMAGES,
    }

    def create(self, request, *args, **kwargs):
        data = s.RegistryCredentialSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        credential = services.registry_credential_set(
            tenant=request.tenant,
            user=request.user,
            request=request._request,
            **data.validated_data,
        )
        return Response(
            s.RegistryCredentialSerializer(credential).data, status=status.HTTP_201_CREATED
        )

    def destroy(self, request, *args, **kwargs):
        services.registry_credential_delete(
            credential=self.get_object(), user=request.user, request=request._request
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class NodePoolViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Active pools the caller's organisation may use (pools on the console's own host
    only for organisations staff allow to run there)."""

    serializer_class = s.NodePoolSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request tenant
            return NodePool.objects.none()
        return selectors.pools_for_tenant(self.request.tenant).select_related("region", "gpu_type")


class StaffNodePoolViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Every pool (inactive ones and those on the console's host too), for platform
    staff: read, and change what the staff pool page changes."""

    queryset = NodePool.objects.select_related("region", "gpu_type").order_by(
        "region__slug", "slug"
    )
    serializer_class = s.NodePoolSerializer
    permission_classes = [IsPlatformStaffElseNotFound]

    def perform_update(self, serializer):
        # The serializer's writable fields are exactly the service's editable ones.
        services.node_pool_update(
            pool=serializer.instance,
            changes=dict(serializer.validated_data),
            user=self.request.user,
            request=self.request._request,
        )


class PriceVersionViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Read by every member (prices are public to customers); published by staff."""

    queryset = PriceVersion.objects.prefetch_related(
        Prefetch("entries", queryset=PriceEntry.objects.select_related("gpu_type", "region"))
    )
    serializer_class = s.PriceVersionSerializer

    def get_permissions(self):
        if self.action == "create":
            return [IsPlatformStaff()]
        return [(IsPlatformStaff | IsTenantMember)()]  # staff tokens read the price book

    @extend_schema(request=s.PriceVersionInSerializer, responses={201: s.PriceVersionSerializer})
    def create(self, request, *args, **kwargs):
        data = s.PriceVersionInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        version = services.price_version_publish(
            effective_from=values["effective_from"],
            rows=[
                services.PriceRow(
                    gpu_type=e["gpu_type"], region=e["region"], on_demand_price=e["on_demand_price"]
                )
                for e in values["entries"]
            ],
            spot_discount_percent=values["spot_discount_percent"],
            reserved_discount_percent={
                1: values["reserved_1m_discount_percent"],
                3: values["reserved_3m_discount_percent"],
                12: values["reserved_12m_discount_percent"],
            },
            currency=values["currency"],
            note=values["note"],
            user=request.user,
            request=request._request,
        )
        return Response(s.PriceVersionSerializer(version).data, status=status.HTTP_201_CREATED)
