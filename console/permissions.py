"""Roles and what each may do: the one place where role checks live.

Views use `capability_required`, API views `HasCapability` (via `required_capability`),
templates `can.<capability>` from the context processor. All read ROLE_CAPABILITIES.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import models
from rest_framework.exceptions import NotFound
from rest_framework.exceptions import PermissionDenied as ApiPermissionDenied
from rest_framework.permissions import BasePermission


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"
    FINANCE = "finance", "Finance"


class Capability(enum.StrEnum):
    VIEW_TENANT = "view_tenant"  # dashboards, jobs, catalog: every member
    LAUNCH_JOBS = "launch_jobs"
    # Priority `critical` skips budget pauses and outranks everyone's jobs.
    LAUNCH_CRITICAL = "launch_critical"
    MANAGE_MEMBERS = "manage_members"
    MANAGE_TOKENS = "manage_tokens"  # every token of the tenant, not just one's own
    USE_API_TOKENS = "use_api_tokens"  # create and revoke one's own tokens
    VIEW_AUDIT = "view_audit"
    VIEW_BILLING = "view_billing"
    VIEW_INVOICES = "view_invoices"  # the organisation's invoices and credit notes
    BUY_CREDIT = "buy_credit"  # pay for prepaid credit (Stripe Checkout): the owner only
    MANAGE_BUDGETS = "manage_budgets"
    MANAGE_PRIVATE_IMAGES = "manage_private_images"
    MANAGE_SECRETS = "manage_secrets"


_EVERYONE = {Capability.VIEW_TENANT, Capability.USE_API_TOKENS}
ROLE_CAPABILITIES: dict[str, frozenset[Capability]] = {
    Role.OWNER: frozenset(Capability),
    Role.ADMIN: frozenset(Capability) - {Capability.BUY_CREDIT},
    Role.MEMBER: frozenset(_EVERYONE | {Capability.LAUNCH_JOBS, Capability.VIEW_BILLING}),
    Role.VIEWER: frozenset(_EVERYONE),
    Role.FINANCE: frozenset(
        _EVERYONE | {Capability.VIEW_BILLING, Capability.MANAGE_BUDGETS, Capability.VIEW_INVOICES}
    ),
}

# Roles an admin may hand out; only an owner may create or change owners.
ASSIGNABLE_BY = {
    Role.OWNER: set(Role.values),
    Role.ADMIN: set(Role.values) - {Role.OWNER},
}


def has_capability(membership: Any, capability: Capability) -> bool:
    if membership is None:
        return False
    return capability in ROLE_CAPABILITIES.get(membership.role, frozenset())


def can_assign_role(membership: Any, role: str) -> bool:
    return membership is not None and role in ASSIGNABLE_BY.get(membership.role, set())


def capability_required(capability: Capability) -> Callable:
    """View decorator: sign-in required, then the capability in the current tenant.

    A signed-in user without any tenant membership is sent to create or join one.
    """

    def decorator(view: Callable) -> Callable:
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not request.user.is_authenticated:
                from django.contrib.auth.views import redirect_to_login

                return redirect_to_login(request.get_full_path())
            membership = getattr(request, "membership", None)
            if membership is None:
                from django.contrib import messages
                from django.shortcuts import redirect

                messages.info(
                    request, "Create an organisation, or open an invitation link, to get started."
                )
                return redirect("tenant_create")
            if not has_capability(membership, capability):
                raise PermissionDenied("Your role in this organisation does not allow this.")
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def staff_required(view: Callable) -> Callable:
    """Platform-staff pages. Others get 404: the console's staff area is not advertised."""
    from django.contrib.auth.views import redirect_to_login
    from django.http import Http404

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            raise Http404("Not found.")
        return view(request, *args, **kwargs)

    return wrapper


STAFF_TOKEN_REFUSAL = "This token has no organisation; it can only call staff endpoints."


class IsTenantMember(BasePermission):
    """Default for the API: authenticated and a member of the request's tenant.

    A view may name `required_capability` (or a per-action dict
    `required_capabilities`) for more.
    """

    message = "You are not a member of an organisation, or your role does not allow this."

    def has_permission(self, request, view) -> bool:
        # Touch request.user first: DRF authenticates lazily, and token authentication
        # is what sets the request's tenant and membership.
        if not (request.user and request.user.is_authenticated):
            return False
        membership = getattr(request, "membership", None)
        if membership is None:
            if getattr(request.auth, "is_staff_token", False):
                raise ApiPermissionDenied(STAFF_TOKEN_REFUSAL, code="staff_token")
            return False
        per_action = getattr(view, "required_capabilities", {})
        capability = per_action.get(getattr(view, "action", None)) or getattr(
            view, "required_capability", Capability.VIEW_TENANT
        )
        return has_capability(membership, capability)


class IsPlatformStaff(BasePermission):
    """API views for platform staff only (the catalog, prices, organisations' settings)."""

    message = "Only platform staff can change this."

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)


class IsPlatformStaffElseNotFound(IsPlatformStaff):
    """Staff-only API about other organisations: like the staff pages, it is not
    advertised, so a signed-in non-staff caller gets 404 (anonymous callers 401/403)."""

    def has_permission(self, request, view) -> bool:
        if not hasattr(view, request.method.lower()):
            return True  # a method the endpoint lacks: the view answers 405, as everywhere
        if request.user and request.user.is_authenticated and not request.user.is_staff:
            raise NotFound()
        return super().has_permission(request, view)
