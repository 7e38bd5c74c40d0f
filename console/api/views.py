"""Accounts and tenancy API: thin views over console.services and console.selectors."""

from __future__ import annotations

from django.contrib.auth import authenticate
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.viewsets import GenericViewSet

from console import host_access, registration, selectors, tenant_admin
from console.api import serializers as s
from console.api.base import TenantScopedViewSet
from console.api.errors import error_response
from console.api.params import query_params
from console.api.schema import ErrorSerializer
from console.models import ApiToken, AuditEvent, Invitation, Membership, Tenant
from console.permissions import Capability, IsPlatformStaff, IsPlatformStaffElseNotFound
from console.services.invitations import invitation_create, invitation_revoke
from console.services.memberships import membership_change_role, membership_remove
from console.services.ssh_keys import ssh_key_add, ssh_key_delete
from console.services.tenants import tenant_self_repair_defaults_set
from console.services.tokens import api_token_create, api_token_revoke


class TokenLoginView(APIView):
    """Exchange e-mail + password for an API token (the SDK/CLI login). Shown once."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        request=s.TokenLoginSerializer,
        responses={
            201: s.RawTokenSerializer,
            401: ErrorSerializer,
            403: ErrorSerializer,
            429: ErrorSerializer,
        },
        auth=[],
    )
    def post(self, request):
        data = s.TokenLoginSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        email, password = data.validated_data["email"], data.validated_data["password"]
        # As on the sign-in page (console.forms): the right password of an account that
        # awaits verification is no failed sign-in (not logged, not counted toward
        # lockout) but a refusal that says what to do; authenticate() would count it.
        awaiting, user = registration.sign_in_awaiting_verification(
            request=request._request, email=email, password=password
        )
        if awaiting is registration.UnverifiedSignIn.RIGHT_PASSWORD:
            return error_response(
                status.HTTP_403_FORBIDDEN,
                "Verify your e-mail address first: follow the link we e-mailed you, then "
                "sign in again.",
                "permission_denied",
            )
        if awaiting is registration.UnverifiedSignIn.NOT_UNVERIFIED:
            user = authenticate(request._request, username=email, password=password)
        if getattr(request._request, "axes_locked_out", False):
            return Response(status=429)  # replaced by AxesMiddleware with the lockout body
        if user is None:
            return error_response(
                status.HTTP_401_UNAUTHORIZED,
                "E-mail or password is wrong.",
                "authentication_failed",
            )
        slug = data.validated_data.get("tenant")
        if user.is_staff and not slug:
            tenant = None  # staff automation: the staff endpoints, no organisation's data
        else:
            memberships = selectors.memberships_of_user(user=user)
            membership = (
                memberships.filter(tenant__slug=slug).first() if slug else memberships.first()
            )
            if membership is None:
                detail = (
                    f"You are not a member of “{slug}”."
                    if slug
                    else "You are not a member of any organisation."
                )
                return error_response(status.HTTP_403_FORBIDDEN, detail, "permission_denied")
            tenant = membership.tenant
        token, raw = api_token_create(
            user=user, tenant=tenant, name=data.validated_data["name"], request=request._request
        )
        return Response(
            {
                "token": raw,
                "id": token.pk,
                "name": token.name,
                "tenant": tenant.slug if tenant else None,
            },
            status=status.HTTP_201_CREATED,
        )


class MeView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses=s.MeSerializer)
    def get(self, request):
        user = request.user
        membership = getattr(request, "membership", None)
        return Response(
            s.MeSerializer(
                {
                    "id": user.pk,
                    "email": user.email,
                    "full_name": user.full_name,
                    "is_staff": user.is_staff,
                    "tenant": membership.tenant.slug if membership else None,
                    "role": membership.role if membership else None,
                }
            ).data
        )


class OrganisationSettingsView(APIView):
    """The settings of the caller's organisation (the token's, or the page's current
    one): every member reads them, owners and admins change them (PUT and PATCH both
    change only the fields given)."""

    required_capabilities = {
        "put": Capability.MANAGE_ORGANISATION,
        "patch": Capability.MANAGE_ORGANISATION,
    }

    def initial(self, request, *args, **kwargs):
        # console.permissions.IsTenantMember reads per-action capabilities from `action`.
        self.action = request.method.lower()
        super().initial(request, *args, **kwargs)

    @extend_schema(responses=s.OrganisationSettingsSerializer)
    def get(self, request):
        return Response(s.OrganisationSettingsSerializer(request.tenant).data)

    @extend_schema(
        request=s.OrganisationSettingsSerializer,
        responses={200: s.OrganisationSettingsSerializer, 403: ErrorSerializer},
    )
    def put(self, request):
        data = s.OrganisationSettingsSerializer(request.tenant, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        tenant = tenant_self_repair_defaults_set(
            tenant=request.tenant,
            by_membership=request.membership,
            request=request._request,
            **data.validated_data,
        )
        return Response(s.OrganisationSettingsSerializer(tenant).data)

    @extend_schema(
        request=s.OrganisationSettingsSerializer,
        responses={200: s.OrganisationSettingsSerializer, 403: ErrorSerializer},
    )
    def patch(self, request):
        return self.put(request)


class TenantListView(mixins.ListModelMixin, TenantScopedViewSet):
    """Organisations the caller belongs to (not scoped to one tenant: it's the user's list)."""

    serializer_class = s.TenantMembershipSerializer
    permission_classes = [IsAuthenticated]

    def get_queryset(self):
        return selectors.memberships_of_user(user=self.request.user)


class MemberViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    TenantScopedViewSet,
):
    queryset = Membership.objects.select_related("user").order_by("user__email")
    serializer_class = s.MemberSerializer
    required_capabilities = {
        "update": Capability.MANAGE_MEMBERS,
        "partial_update": Capability.MANAGE_MEMBERS,
        "destroy": Capability.MANAGE_MEMBERS,
    }

    def perform_update(self, serializer):
        serializer.instance = membership_change_role(
            membership=serializer.instance,
            role=serializer.validated_data.get("role", serializer.instance.role),
            by_membership=self.request.membership,
            request=self.request._request,
        )

    def perform_destroy(self, instance):
        membership_remove(
            membership=instance,
            by_membership=self.request.membership,
            request=self.request._request,
        )


class InvitationViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    TenantScopedViewSet,
):
    queryset = Invitation.objects.all()
    serializer_class = s.InvitationSerializer
    required_capability = Capability.MANAGE_MEMBERS

    @extend_schema(responses={201: s.InvitationCreatedSerializer})
    def create(self, request, *args, **kwargs):
        data = s.InvitationSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        invitation, raw = invitation_create(
            tenant=request.tenant,
            by_membership=request.membership,
            email=data.validated_data["email"],
            role=data.validated_data["role"],
            accept_url_for=lambda t: request.build_absolute_uri(
                reverse("invitation_accept", args=[t])
            ),
            request=request._request,
        )
        invitation.accept_url = request.build_absolute_uri(reverse("invitation_accept", args=[raw]))
        return Response(
            s.InvitationCreatedSerializer(invitation).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(
        responses={200: s.InvitationSerializer},
        description="Revokes the invitation. It stays readable, for the record: GET "
        'answers it with state "revoked".',
    )
    def destroy(self, request, *args, **kwargs):
        invitation = invitation_revoke(
            invitation=self.get_object(), by_user=request.user, request=request._request
        )
        return Response(s.InvitationSerializer(invitation).data)


class ApiTokenViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    TenantScopedViewSet,
):
    """The caller's tokens (owners and admins: the organisation's). Called with a staff
    automation token: that staff user's own tokens without organisation."""

    queryset = ApiToken.objects.all()
    serializer_class = s.ApiTokenSerializer
    required_capability = Capability.USE_API_TOKENS

    def _staff_token(self) -> bool:
        return getattr(self.request.auth, "is_staff_token", False)

    def get_permissions(self):
        return [IsPlatformStaff()] if self._staff_token() else super().get_permissions()

    def get_queryset(self):
        if self._staff_token():
            return selectors.staff_api_tokens_of(user=self.request.user)
        return selectors.api_tokens_visible_to(membership=self.request.membership)

    @extend_schema(responses={201: s.ApiTokenCreatedSerializer})
    def create(self, request, *args, **kwargs):
        data = s.ApiTokenSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, raw = api_token_create(
            user=request.user,
            tenant=request.tenant,
            name=data.validated_data["name"],
            request=request._request,
        )
        token.token = raw
        return Response(s.ApiTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        responses={200: s.ApiTokenSerializer},
        description="Revokes the token at once. A revoked token stays readable, for the "
        "record: GET answers it with is_active false and its revoked_at.",
    )
    def destroy(self, request, *args, **kwargs):
        token = api_token_revoke(
            token=self.get_object(), by_user=request.user, request=request._request
        )
        return Response(s.ApiTokenSerializer(token).data)


class SshKeyViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    GenericViewSet,
):
    """The caller's own SSH public keys (a person's, in every organisation: not scoped to
    the token's tenant). Another person's key id is a 404."""

    serializer_class = s.SshKeySerializer
    permission_classes = [IsAuthenticated]
    lookup_value_regex = r"\d+"

    def get_queryset(self):
        return selectors.ssh_keys_of_user(user=self.request.user)

    @extend_schema(
        request=s.SshKeyCreateSerializer,
        responses={201: s.SshKeySerializer, 400: ErrorSerializer, 409: ErrorSerializer},
        description="Add a public key. 400: not a public key, a private key pasted by "
        "mistake (not stored), DSA, RSA under 3,072 bits, options or a certificate; 409: "
        "the same key again, or 50 keys already.",
    )
    def create(self, request, *args, **kwargs):
        data = s.SshKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = ssh_key_add(
            user=request.user,
            public_key=data.validated_data["public_key"],
            title=data.validated_data["title"],
            request=request._request,
        )
        return Response(s.SshKeySerializer(key).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, 404: ErrorSerializer})
    def destroy(self, request, *args, **kwargs):
        ssh_key_delete(key=self.get_object(), request=request._request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuditEventViewSet(mixins.ListModelMixin, TenantScopedViewSet):
    queryset = AuditEvent.objects.select_related("actor")
    serializer_class = s.AuditEventSerializer
    required_capability = Capability.VIEW_AUDIT

    def scope_queryset(self, queryset):
        prefix = query_params(s.AuditQuerySerializer, self.request)["action"]
        return queryset.filter(action__startswith=prefix) if prefix else queryset

    @extend_schema(parameters=[s.AuditQuerySerializer])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)


class StaffTenantViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin, GenericViewSet
):
    """Every organisation, for platform staff: whether it may run jobs on this host, its
    fair-share weight; suspending and reactivating it."""

    queryset = Tenant.objects.order_by("name")
    serializer_class = s.StaffTenantSerializer
    permission_classes = [IsPlatformStaffElseNotFound]
    lookup_field = "slug"

    def perform_update(self, serializer):
        allowed = serializer.validated_data.get("may_run_on_host")
        tenant = serializer.instance
        if allowed is not None:
            tenant = host_access.tenant_set_may_run_on_host(
                tenant=tenant,
                allowed=allowed,
                user=self.request.user,
                request=self.request._request,
            )
        weight = serializer.validated_data.get("fair_share_weight")
        if weight is not None:
            tenant = tenant_admin.tenant_fair_share_set(
                tenant=tenant, weight=weight, user=self.request.user, request=self.request._request
            )
        serializer.instance = tenant

    @extend_schema(request=s.StaffTenantSuspendSerializer, responses=s.StaffTenantSerializer)
    @action(detail=True, methods=["post"])
    def suspend(self, request, slug=None):
        data = s.StaffTenantSuspendSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = tenant_admin.tenant_suspend(
            tenant=self.get_object(),
            reason=data.validated_data["reason"],
            user=request.user,
            request=request._request,
        )
        return Response(s.StaffTenantSerializer(tenant).data)

    @extend_schema(request=None, responses=s.StaffTenantSerializer)
    @action(detail=True, methods=["post"])
    def reactivate(self, request, slug=None):
        tenant = tenant_admin.tenant_reactivate(
            tenant=self.get_object(), user=request.user, request=request._request
        )
        return Response(s.StaffTenantSerializer(tenant).data)
