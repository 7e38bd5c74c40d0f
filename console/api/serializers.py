from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from console.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictDecimalField,
    StrictEmailField,
    StrictModelSerializer,
    StrictSlugField,
)
from console.models import ApiToken, AuditEvent, Invitation, Membership, SshPublicKey, Tenant
from console.permissions import Role


class TokenLoginSerializer(serializers.Serializer):
    email = StrictEmailField()
    password = StrictCharField(trim_whitespace=False, style={"input_type": "password"})
    tenant = StrictSlugField(
        required=False,
        allow_blank=True,
        help_text=(
            "Slug of the organisation; default: your first. Platform staff who leave it out"
            " get a staff automation token: staff endpoints only, no organisation's data."
        ),
    )
    name = StrictCharField(
        max_length=100,
        required=False,
        default="cli",
        help_text="A name to tell the token apart later.",
    )


class RawTokenSerializer(serializers.Serializer):
    token = StrictCharField(help_text="Shown once. Send as `Authorization: Bearer …`.")
    id = serializers.IntegerField()
    name = StrictCharField()
    tenant = StrictSlugField(allow_null=True, help_text="None for a staff automation token.")


class TenantMembershipSerializer(StrictModelSerializer):
    slug = StrictCharField(source="tenant.slug")
    name = StrictCharField(source="tenant.name")

    class Meta:
        model = Membership
        fields = ["slug", "name", "role"]


class StaffTenantSerializer(StrictModelSerializer):
    """An organisation as platform staff see and set it."""

    fair_share_weight = StrictDecimalField(
        max_digits=5,
        decimal_places=2,
        min_value=Decimal("0.01"),
        max_value=Decimal("100"),
        required=False,
        help_text="Its weight in shared pools (1 for everyone by default): among queued "
        "jobs of one priority, its share of a pool counts divided by it.",
    )

    class Meta:
        model = Tenant
        fields = [
            "slug",
            "name",
            "is_active",
            "may_run_on_host",
            "fair_share_weight",
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
    reason = StrictCharField(max_length=500)


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    email = StrictEmailField()
    full_name = StrictCharField()
    is_staff = StrictBooleanField()
    tenant = StrictCharField(allow_null=True)
    role = StrictCharField(allow_null=True)


class MemberSerializer(StrictModelSerializer):
    email = StrictEmailField(source="user.email", read_only=True)
    full_name = StrictCharField(source="user.full_name", read_only=True)
    role = serializers.ChoiceField(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["id", "email", "full_name", "role", "created_at"]
        read_only_fields = ["id", "email", "full_name", "created_at"]


class InvitationSerializer(StrictModelSerializer):
    state = StrictCharField(read_only=True)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "state", "created_at", "expires_at"]
        read_only_fields = ["id", "state", "created_at", "expires_at"]


class InvitationCreatedSerializer(InvitationSerializer):
    accept_url = StrictCharField(read_only=True, help_text="Shown once.")

    class Meta(InvitationSerializer.Meta):
        fields = [*InvitationSerializer.Meta.fields, "accept_url"]


class ApiTokenSerializer(StrictModelSerializer):
    owner = StrictEmailField(source="user.email", read_only=True)
    is_active = StrictBooleanField(read_only=True)

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
    token = StrictCharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class SshKeySerializer(StrictModelSerializer):
    key_type = StrictCharField(
        read_only=True, help_text="ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa."
    )
    type_label = StrictCharField(read_only=True, help_text='For people: "ED25519", "RSA 4096".')
    public_key = StrictCharField(
        read_only=True, help_text="Normalised: the key type and its base64, no comment."
    )
    fingerprint = StrictCharField(
        read_only=True, help_text="SHA256 fingerprint as `ssh-keygen -l` prints it."
    )

    class Meta:
        model = SshPublicKey
        fields = [
            "id",
            "title",
            "key_type",
            "bits",
            "type_label",
            "public_key",
            "comment",
            "fingerprint",
            "created_at",
            "last_used_at",
        ]
        read_only_fields = fields


class SshKeyCreateSerializer(serializers.Serializer):
    public_key = StrictCharField(
        max_length=8192,
        help_text="One line as in a .pub file: `ssh-ed25519 AAAA… comment`. Ed25519, ECDSA "
        "(nistp256/384/521) or RSA of at least 3,072 bits; never a private key.",
    )
    title = StrictCharField(
        max_length=100,
        required=False,
        allow_blank=True,
        default="",
        help_text="Default: the key's comment.",
    )


class AuditQuerySerializer(serializers.Serializer):
    action = StrictCharField(
        required=False,
        default="",
        allow_blank=True,
        max_length=100,
        help_text="Actions starting with this, e.g. api_token.",
    )


class AuditEventSerializer(StrictModelSerializer):
    actor = StrictCharField(source="actor_label")

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


class OrganisationSettingsSerializer(StrictModelSerializer):
    """The organisation's settings its owners and admins choose: what self-repair does
    for its jobs that made no choice of their own (PUT /api/v1/jobs/{id}/monitor)."""

    hardware_repair_default = StrictBooleanField(
        required=False,
        help_text="Checkpoint a job and requeue it on another node when one of its GPUs "
        "reports a hardware fault (XID error) or one of its ranks is stuck (on by default). "
        "Off, the job is alerted and the node marked suspect, but the job keeps running.",
    )
    loss_explosion_pause_default = StrictBooleanField(
        required=False,
        help_text="Pause a job whose logged loss explodes (above the run's mean + 3σ, or "
        "NaN), and tell its owner (on by default).",
    )

    class Meta:
        model = Tenant
        fields = ["slug", "name", "hardware_repair_default", "loss_explosion_pause_default"]
        read_only_fields = ["slug", "name"]
