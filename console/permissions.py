"""Roles and what each may do: the one place where role checks live.

Views use `capability_required`, API views `HasCapability` (via `required_capability`),
templates `can.<capability>` from the context processor. All read ROLE_CAPABILITIES.

Acting on one job or launch template also depends on whose it is: `job_action_refusal`
and `template_change_refusal` are that rule, used by the pages (`job_action_check`,
`template_change_check`), the API (`MayActOnJob`) and the templates (`may_act_on_job`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from functools import wraps
from typing import Any, Protocol

from django.core.exceptions import PermissionDenied
from django.db import models
from rest_framework.exceptions import NotFound
from rest_framework.exceptions import PermissionDenied as ApiPermissionDenied
from rest_framework.permissions import SAFE_METHODS, BasePermission


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
    # The organisation's settings (its jobs' self-repair defaults): owners and admins.
    MANAGE_ORGANISATION = "manage_organisation"
    # Pause, resume, cancel, delete and clone anyone's jobs and delete anyone's launch
    # templates; without it, only one's own (with LAUNCH_JOBS).
    ACT_ON_OTHERS_JOBS = "act_on_others_jobs"


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


class ActedOnJob(Protocol):
    """What the job rule reads of a job (console can't import jobs)."""

    @property
    def created_by_id(self) -> int | None: ...

    @property
    def is_critical(self) -> bool: ...


class SavedByUser(Protocol):
    @property
    def created_by_id(self) -> int | None: ...


NO_ROLE_TO_ACT = "Your role in this organisation does not allow this."
CRITICAL_JOB_REFUSAL = (
    "Only owners and admins may pause, resume, cancel, delete or clone a critical job."
)
OTHERS_JOB_REFUSAL = (
    "Members may pause, resume, cancel, delete and clone only the jobs they launched; "
    "ask an owner or admin to act on this one."
)
OTHERS_TEMPLATE_REFUSAL = (
    "Members may change or delete only the launch templates they saved; ask an owner or "
    "admin to change this one."
)


def job_action_refusal(membership: Any, job: ActedOnJob) -> str | None:
    """Why `membership` may not pause, resume, cancel, delete or clone `job` (or set what
    pauses it), or None when it may. Deny by default: a role that can't launch acts on
    nothing; `critical` (which skips budget pauses and outranks everyone) is for those
    who may launch it; a member acts on the jobs they launched, owners and admins on
    any. The caller has already found `job` in the membership's tenant."""
    if not has_capability(membership, Capability.LAUNCH_JOBS):
        return NO_ROLE_TO_ACT
    if job.is_critical and not has_capability(membership, Capability.LAUNCH_CRITICAL):
        return CRITICAL_JOB_REFUSAL
    if not _own_or_anyones(membership, job.created_by_id):
        return OTHERS_JOB_REFUSAL
    return None


def may_act_on_job(membership: Any, job: ActedOnJob) -> bool:
    return job_action_refusal(membership, job) is None


def template_change_refusal(membership: Any, template: SavedByUser) -> str | None:
    """Why `membership` may not replace or delete a launch template, or None: as for
    jobs, members change their own, owners and admins any."""
    if not has_capability(membership, Capability.LAUNCH_JOBS):
        return NO_ROLE_TO_ACT
    if not _own_or_anyones(membership, template.created_by_id):
        return OTHERS_TEMPLATE_REFUSAL
    return None


def may_change_template(membership: Any, template: SavedByUser) -> bool:
    return template_change_refusal(membership, template) is None


def _own_or_anyones(membership: Any, created_by_id: int | None) -> bool:
    # A job the platform launched, or whose launcher's account is gone, has no owner:
    # only those who act on anyone's may act on it.
    if created_by_id is not None and created_by_id == membership.user_id:
        return True
    return has_capability(membership, Capability.ACT_ON_OTHERS_JOBS)


def job_action_check(membership: Any, job: ActedOnJob) -> None:
    """Pages: `job_action_refusal` as a 403 page that says why."""
    refusal = job_action_refusal(membership, job)
    if refusal is not None:
        raise PermissionDenied(refusal)


def template_change_check(membership: Any, template: SavedByUser) -> None:
    """Pages: `template_change_refusal` as a 403 page that says why."""
    refusal = template_change_refusal(membership, template)
    if refusal is not None:
        raise PermissionDenied(refusal)


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


class MayActOnJob(BasePermission):
    """Object permission of the API's job views: reading is for every member (the
    view's capabilities decide), every write to a job (pause, resume, cancel, clone,
    delete, its auto-stop) follows `job_action_refusal`, which is the 403's message."""

    message = NO_ROLE_TO_ACT

    def has_object_permission(self, request, view, obj) -> bool:
        if request.method in SAFE_METHODS:
            return True
        refusal = job_action_refusal(getattr(request, "membership", None), obj)
        if refusal is None:
            return True
        self.message = refusal  # a fresh instance per request (APIView.get_permissions)
        return False
