"""Services API: create, list, inspect, change, scale, roll back, delete; revisions,
replicas and endpoint tokens. Thin over services.services / services.selectors."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from console.api.base import TenantScopedViewSet
from console.api.errors import error_response
from console.api.schema import ErrorSerializer
from console.permissions import Capability
from services import selectors, services
from services.api import serializers as s
from services.logs import LogsUnavailable, replica_log_lines
from services.models import Service

WRITES = ("create", "partial_update", "destroy", "rollback", "scale", "token_revoke")


class ServiceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = Service.objects.all()
    serializer_class = s.ServiceSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    required_capabilities = {a: Capability.LAUNCH_JOBS for a in WRITES}

    def scope_queryset(self, queryset):
        return selectors.services_with_counts(queryset)

    def _answer(self, service: Service, code: int = status.HTTP_200_OK) -> Response:
        fresh = self.get_queryset().get(pk=service.pk)  # with its replica counts
        return Response(self.get_serializer(fresh).data, status=code)

    @extend_schema(
        request=s.ServiceCreateSerializer,
        responses={
            201: s.ServiceSerializer,
            400: ErrorSerializer,
            403: ErrorSerializer,
            409: ErrorSerializer,
        },
    )
    def create(self, request, *args, **kwargs):
        data = s.ServiceCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        service = services.service_create(
            tenant=request.tenant, user=request.user, spec=data.to_spec(), request=request._request
        )
        return self._answer(service, status.HTTP_201_CREATED)

    @extend_schema(
        request=s.ServiceUpdateSerializer,
        responses={200: s.ServiceSerializer, 400: ErrorSerializer},
    )
    def partial_update(self, request, *args, **kwargs):
        service = self.get_object()
        data = s.ServiceUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        service = services.service_update(
            service=service, user=request.user, changes=data.changes(), request=request._request
        )
        return self._answer(service)

    def destroy(self, request, *args, **kwargs):
        services.service_delete(
            service=self.get_object(), user=request.user, request=request._request
        )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=s.ServiceRollbackSerializer,
        responses={200: s.ServiceSerializer, 400: ErrorSerializer, 409: ErrorSerializer},
    )
    @action(detail=True, methods=["post"])
    def rollback(self, request, pk=None):
        service = self.get_object()
        data = s.ServiceRollbackSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        service = services.service_rollback(
            service=service,
            user=request.user,
            revision_number=data.validated_data["revision"],
            request=request._request,
        )
        return self._answer(service)

    @extend_schema(
        request=s.ServiceScaleSerializer,
        responses={200: s.ServiceSerializer, 400: ErrorSerializer},
    )
    @action(detail=True, methods=["post"])
    def scale(self, request, pk=None):
        service = self.get_object()
        data = s.ServiceScaleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        service = services.service_scale(
            service=service, user=request.user, request=request._request, **data.validated_data
        )
        return self._answer(service)

    @extend_schema(request=None, responses=s.ServiceRevisionSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def revisions(self, request, pk=None):
        revisions = selectors.service_revisions(service=self.get_object())
        return Response(s.ServiceRevisionSerializer(revisions, many=True).data)

    @extend_schema(request=None, responses=s.ServiceReplicaSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, url_path="replicas")
    def replica_list(self, request, pk=None):
        replicas = selectors.service_replicas(service=self.get_object())
        return Response(s.ServiceReplicaSerializer(replicas, many=True).data)

    @extend_schema(
        request=None,
        parameters=[s.ReplicaLogsQuerySerializer],
        responses={200: s.ReplicaLogsSerializer, 400: ErrorSerializer, 503: ErrorSerializer},
    )
    @action(
        detail=True,
        methods=["get"],
        url_path=r"replicas/(?P<replica_id>\d+)/logs",
        url_name="replica-logs",
    )
    def replica_logs(self, request, pk=None, replica_id=None):
        """A replica's latest log lines (`tail`, 1 to 5000, default 200), oldest first."""
        service = self.get_object()
        replica = get_object_or_404(selectors.service_replicas(service=service), pk=replica_id)
        query = s.ReplicaLogsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        try:
            lines = replica_log_lines(replica, tail=query.validated_data["tail"])
        except LogsUnavailable as error:
            return error_response(
                503, f"The replica's log can't be read now: {error}", "unavailable"
            )
        return Response({"replica": replica.pk, "state": replica.state, "lines": lines})

    @extend_schema(request=None, responses=s.ServiceScaleEventSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, url_path="scale-events")
    def scale_events(self, request, pk=None):
        """The latest changes of the wanted replica count and what decided them."""
        events = selectors.service_scale_events(service=self.get_object())
        return Response(s.ServiceScaleEventSerializer(events, many=True).data)

    @extend_schema(methods=["GET"], request=None, responses=s.ServiceTokenSerializer(many=True))
    @extend_schema(
        methods=["POST"],
        request=s.ServiceTokenCreateSerializer,
        responses={201: s.ServiceTokenCreatedSerializer, 400: ErrorSerializer},
    )
    @action(detail=True, methods=["get", "post"], pagination_class=None)
    def tokens(self, request, pk=None):
        service = self.get_object()
        if request.method == "GET":
            tokens = selectors.service_tokens(service=service)
            return Response(s.ServiceTokenSerializer(tokens, many=True).data)
        data = s.ServiceTokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, raw = services.service_token_create(
            service=service,
            user=request.user,
            name=data.validated_data["name"],
            request=request._request,
        )
        body = s.ServiceTokenCreatedSerializer(token, context={"raw": raw}).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None})
    @action(
        detail=True,
        methods=["delete"],
        url_path=r"tokens/(?P<service_token_id>\d+)",
        url_name="token-revoke",
    )
    def token_revoke(self, request, pk=None, service_token_id=None):
        service = self.get_object()
        token = get_object_or_404(service.tokens, pk=service_token_id)
        services.service_token_revoke(token=token, user=request.user, request=request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)
