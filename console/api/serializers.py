from __future__ import annotations

from rest_framework import serializers

from console.models import ApiToken, AuditEvent, Invitation, Membership, Tenant
from console.permissions import Role


class TokenLoginSerializer(serializers.Serializer):
    email = serializers.EmailField()
    password = serializers.CharField(trim_whitespace=False, style={"input_type": "password"})
    tenant = serializers.SlugField(
        required=False,
        allow_blank=True,
        help_text=(
            "Slug of the organisation; default: your first. Platform staff who leave it out"
            " get a staff automation token: staff endpoints only, no organisation's data."
        ),
    )
    name = serializers.CharField(
        max_length=100,
        required=False,
        default="cli",
        help_text="A name to tell the token apart later.",
    )


class RawTokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="Shown once. Send as `Authorization: Bearer …`.")
    id = serializers.IntegerField()
    name = serializers.CharField()
    tenant = serializers.SlugField(allow_null=True, help_text="None for a staff automation token.")


class TenantMembershipSerializer(serializers.ModelSerializer):
    slug = serializers.CharField(source="tenant.slug")
    name = serializers.CharField(source="tenant.name")

    class Meta:
        model = Membership
        fields = ["slug", "name", "role"]


class StaffTenantSerializer(serializers.ModelSerializer):
    """An organisation as platform staff see and set it."""

    class Meta:
        model = Tenant
        fields = [
            "slug",
            "name",
            "is_active",
            "may_run_on_host",
            "suspended_at",
            "suspension_reason",
            "created_at",
        ]
        read_only_fields = [
            "slug",
            "name",
            "is_active",
            "suspended_at",
            "suspension_reason",
            "created_at",
        ]


class StaffTenantSuspendSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500)


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    email = serializers.EmailField()
    full_name = serializers.CharField()
    is_staff = serializers.BooleanField()
    tenant = serializers.CharField(allow_null=True)
    role = serializers.CharField(allow_null=True)


class MemberSerializer(serializers.ModelSerializer):
    email = serializers.EmailField(source="user.email", read_only=True)
    full_name = serializers.CharField(source="user.full_name", read_only=True)
    role = serializers.ChoiceField(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["id", "email", "full_name", "role", "created_at"]
        read_only_fields = ["id", "email", "full_name", "created_at"]


class InvitationSerializer(serializers.ModelSerializer):
    state = serializers.CharField(read_only=True)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "state", "created_at", "expires_at"]
        read_only_fields = ["id", "state", "created_at", "expires_at"]


class InvitationCreatedSerializer(InvitationSerializer):
    accept_url = serializers.CharField(read_only=True, help_text="Shown once.")

    class Meta(InvitationSerializer.Meta):
        fields = [*InvitationSerializer.Meta.fields, "accept_url"]


class ApiTokenSerializer(serializers.ModelSerializer):
    owner = serializers.EmailField(source="user.email", read_only=True)
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "owner",
            "created_at",
            "last_used_at",
            "revoked_at",
            "is_active",
        ]
        read_only_fields = [
            "id",
            "prefix",
            "owner",
            "created_at",
            "last_used_at",
            "revoked_at",
            "is_active",
        ]


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class AuditQuerySerializer(serializers.Serializer):
    action = serializers.CharField(
        required=False,
        default="",
        allow_blank=True,
        max_length=100,
        help_text="Actions starting with this, e.g. api_token.",
    )


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "created_at",
            "actor",
            "action",
            "target_type",
            "target_id",
            "target_repr",
            "ip_address",
            "metadata",
        ]
