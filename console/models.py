"""Accounts and tenancy: users, tenants, memberships, invitations, API tokens, audit log."""

from __future__ import annotations

import hashlib
from decimal import Decimal

from django.contrib.auth.models import AbstractUser, BaseUserManager
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from console.permissions import Role
from console.ssh_public_keys import key_type_label
from console.tenancy import TenantOwnedModel, TenantScopedQuerySet


def sha256_hex(secret: str) -> str:
    """Tokens are 256-bit random strings, so a fast hash is enough (GitHub/Sentry do the same)."""
    return hashlib.sha256(secret.encode()).hexdigest()


class UserManager(BaseUserManager):
    use_in_migrations = True

    def _create_user(self, email: str, password: str | None, **extra):
        if not email:
            raise ValueError("An e-mail address is required.")
        user = self.model(email=self.normalize_email(email).lower(), **extra)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_user(self, email: str, password: str | None = None, **extra):
        extra.setdefault("is_staff", False)
        extra.setdefault("is_superuser", False)
        return self._create_user(email, password, **extra)

    def create_superuser(self, email: str, password: str | None = None, **extra):
        extra.setdefault("is_staff", True)
        extra.setdefault("is_superuser", True)
        return self._create_user(email, password, **extra)


class User(AbstractUser):
    """A person; signs in with e-mail. Platform staff are `is_staff` users."""

    username = None
    email = models.EmailField("e-mail address", unique=True)
    full_name = models.CharField(max_length=150, blank=True)

    USERNAME_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    objects = UserManager()

    def __str__(self) -> str:
        return self.email

    @property
    def display_name(self) -> str:
        return self.full_name or self.email


class Tenant(models.Model):
    """An organisation renting GPUs; everything it owns is scoped to it."""

    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=60, unique=True)
    is_active = models.BooleanField(default=True)
    # Staff allow this organisation to run jobs on the console's own machine (the local
    # backend's pools), which is not a security boundary. Off unless staff turn it on.
    may_run_on_host = models.BooleanField(default=False)
    # Staff suspended it (console.tenant_admin): its members still see their data, but
    # launches and resumes are refused and its running jobs were paused. Unlike
    # `is_active`, which hides the organisation from its members entirely.
    suspended_at = models.DateTimeField(null=True, blank=True)
    suspension_reason = models.TextField(blank=True)
    # Staff weigh organisations sharing a pool: among queued jobs of one priority, the one
    # with the lowest share of the pool over its weight goes first (jobs.services.fair_share).
    fair_share_weight = models.DecimalField(
        max_digits=5,
        decimal_places=2,
        default=Decimal("1.00"),
        validators=[MinValueValidator(Decimal("0.01")), MaxValueValidator(Decimal("100"))],
    )
    # Self-repair defaults its owners and admins choose for the organisation's jobs (the
    # organisation settings page); a job's own choice overrides them. On by default.
    # Requeue a job on another node when its GPU reports a hardware fault or a rank hangs:
    hardware_repair_default = models.BooleanField(default=True)
    # Pause a job whose logged loss explodes:
    loss_explosion_pause_default = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_suspended(self) -> bool:
        return self.suspended_at is not None


class Membership(TenantOwnedModel):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_user")
        ]
        ordering = ["user__email"]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


class InvitationQuerySet(TenantScopedQuerySet):
    def pending(self, now=None):
        now = now or timezone.now()
        return self.filter(accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=now)


class Invitation(TenantOwnedModel):
    """A single-use, expiring link that makes its holder a member with `role`."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(User, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = InvitationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.tenant}"

    @property
    def state(self) -> str:
        if self.accepted_at:
            return "accepted"
        if self.revoked_at:
            return "revoked"
        if self.expires_at <= timezone.now():
            return "expired"
        return "pending"


class ApiTokenQuerySet(TenantScopedQuerySet):
    def active(self):
        return self.filter(revoked_at__isnull=True)


class ApiToken(TenantOwnedModel):
    """A bearer token for scripts: one user in one tenant, stored only as a hash.

    A platform staff user's token may have no tenant (staff automation): it acts on the
    staff endpoints only, never on an organisation's data."""

    PREFIX = "ggt_"

    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens"
    )
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # The first characters of the token, kept in clear so people can tell tokens apart.
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def is_staff_token(self) -> bool:
        return self.tenant_id is None


class AuditEventQuerySet(TenantScopedQuerySet):
    pass


class AuditEvent(models.Model):
    """Who did what to which object, when, from where. Append-only.

    `tenant` is null for platform-level events (e.g. a sign-in, staff creating a tenant).
    """

    tenant_field = "tenant"

    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="audit_events"
    )
    actor = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept as text so the record survives the user's deletion; also names non-human
    # actors ("system", "budget").
    actor_label = models.CharField(max_length=254)
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    target_repr = models.CharField(max_length=200, blank=True)
    ip_address = models.GenericIPAddressField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.actor_label} {self.action}"


class NotificationQuerySet(TenantScopedQuerySet):
    def unread(self):
        return self.filter(read_at__isnull=True)


class Notification(TenantOwnedModel):
    """An in-app message to one person (a job ended, a budget threshold was crossed)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="notifications")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="notifications")
    level = models.CharField(max_length=10, default="info")  # info | success | warning | error
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    url = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    read_at = models.DateTimeField(null=True, blank=True)

    objects = NotificationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "read_at"])]

    def __str__(self) -> str:
        return self.title


class Heartbeat(models.Model):
    """Last sign of life of a background component (worker, beat, watcher) for /healthz."""

    component = models.CharField(max_length=32, unique=True)
    last_seen = models.DateTimeField()
    hostname = models.CharField(max_length=255, blank=True)
    pid = models.IntegerField(null=True)

    def __str__(self) -> str:
        return f"{self.component} @ {self.last_seen}"


class SshPublicKey(models.Model):
    """A person's SSH public key, for signing in to their dev environments.

    Belongs to a user, not a tenant: the same key opens the environments of every
    organisation the person is a member of. Stored only in normalised form (`type
    base64`, see console.ssh_public_keys), the comment kept apart, so one key pasted twice
    is the same row."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="ssh_keys")
    title = models.CharField(max_length=100)
    key_type = models.CharField(max_length=40)
    bits = models.PositiveIntegerField()
    public_key = models.TextField()
    comment = models.CharField(max_length=200, blank=True)
    fingerprint = models.CharField(max_length=60)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "fingerprint"], name="ssh_key_unique_per_user")
        ]

    def __str__(self) -> str:
        return f"{self.title} ({self.fingerprint})"

    @property
    def type_label(self) -> str:
        return key_type_label(self.key_type, self.bits)
