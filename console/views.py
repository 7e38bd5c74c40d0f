"""Browser pages of the console shell: thin, they parse input, call a service, render."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from console import host_access, selectors, tenant_admin
from console.confirm import confirm_then_act
from console.dashboard import dashboard_sections_context
from console.forms import (
    ApiTokenForm,
    InvitationForm,
    InvitationSignupForm,
    RoleForm,
    TenantForm,
    TenantSuspendForm,
    add_service_error,
)
from console.models import Invitation, Membership, Tenant
from console.permissions import Capability, capability_required, has_capability, staff_required
from console.service_errors import ErrorCode, ServiceError
from console.services import accounts, audit, invitations, memberships, tenants, tokens
from console.services.notifications import notifications_mark_read
from console.staff_extensions import staff_column_headers, staff_panels, staff_tenant_cells
from console.tenancy import SESSION_TENANT_KEY, get_for_tenant_or_404

PAGE_SIZE = 50


def _use_tenant(request: HttpRequest, tenant: Tenant) -> None:
    request.session[SESSION_TENANT_KEY] = tenant.pk


# --- dashboard and tenants ----


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    if request.tenant is None:
        # Staff who belong to no organisation land on the fleet they run.
        return redirect("jobs:staff_fleet" if request.user.is_staff else "tenant_create")
    membership = request.membership
    context = {
        "member_count": selectors.members_for_tenant(tenant=request.tenant).count(),
        "pending_invitations": selectors.invitations_for_tenant(tenant=request.tenant)
        .pending()
        .count(),
        "my_token_count": selectors.api_tokens_visible_to(membership=membership)
        .filter(user=request.user, revoked_at__isnull=True)
        .count(),
        "recent_events": (
            selectors.audit_events_for_tenant(tenant=request.tenant)[:8]
            if has_capability(membership, Capability.VIEW_AUDIT)
            else None
        ),
    }
    context.update(dashboard_sections_context(request))
    if request.htmx and request.htmx.target == "dashboard-jobs":
        # The live job list (refetched on every state change the tenant socket reports).
        return render(request, "console/dashboard.html#dashboard-jobs", context)
    return render(request, "console/dashboard.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def tenant_create(request: HttpRequest) -> HttpResponse:
    form = TenantForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            tenant = tenants.tenant_create(
                name=form.cleaned_data["name"], owner=request.user, request=request
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            _use_tenant(request, tenant)
            messages.success(request, f"{tenant.name} created; you are its owner.")
            return redirect("dashboard")
    return render(request, "console/tenant_create.html", {"form": form})


@login_required
@require_POST
def tenant_switch(request: HttpRequest) -> HttpResponse:
    membership = (
        selectors.memberships_of_user(user=request.user)
        .filter(tenant__slug=request.POST.get("tenant", ""))
        .first()
    )
    if membership is None:
        raise Http404("Not found.")
    _use_tenant(request, membership.tenant)
    messages.info(request, f"Now working in {membership.tenant.name}.")
    if request.htmx:
        return HttpResponseClientRedirect(reverse("dashboard"))
    return redirect("dashboard")


# --- members and invitations ----


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET", "POST"])
def members(request: HttpRequest) -> HttpResponse:
    can_manage = has_capability(request.membership, Capability.MANAGE_MEMBERS)
    form = InvitationForm(request.POST or None)
    invite_link = None
    if request.method == "POST":
        if not can_manage:
            raise Http404("Not found.")
        if form.is_valid():
            try:
                invitation, raw = invitations.invitation_create(
                    tenant=request.tenant,
                    by_membership=request.membership,
                    email=form.cleaned_data["email"],
                    role=form.cleaned_data["role"],
                    accept_url_for=lambda t: request.build_absolute_uri(
                        reverse("invitation_accept", args=[t])
                    ),
                    request=request,
                )
            except ServiceError as error:
                add_service_error(form, error)
            else:
                invite_link = request.build_absolute_uri(reverse("invitation_accept", args=[raw]))
                messages.success(
                    request,
                    f"Invitation for {invitation.email} created and "
                    "e-mailed. Copy the link below: it is shown only once.",
                )
                form = InvitationForm()
    context = {
        "form": form,
        "can_manage": can_manage,
        "invite_link": invite_link,
        "members": selectors.members_for_tenant(tenant=request.tenant),
        "invitations": selectors.invitations_for_tenant(tenant=request.tenant)[:100],
        "role_form": RoleForm(),
    }
    template = "console/members.html#member-area" if request.htmx else "console/members.html"
    return render(request, template, context)


@capability_required(Capability.MANAGE_MEMBERS)
@require_POST
def member_role(request: HttpRequest, membership_id: int) -> HttpResponse:
    membership = get_for_tenant_or_404(Membership, request.tenant, pk=membership_id)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a valid role.")
    else:
        try:
            memberships.membership_change_role(
                membership=membership,
                role=form.cleaned_data["role"],
                by_membership=request.membership,
                request=request,
            )
            messages.success(
                request, f"{membership.user.email} is now {form.cleaned_data['role']}."
            )
        except ServiceError as error:
            messages.error(request, error.message)
    return redirect("members")


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET", "POST"])
def member_remove(request: HttpRequest, membership_id: int) -> HttpResponse:
    """Remove a member (admins) or leave (anyone, on their own membership). Confirms first."""
    membership = get_for_tenant_or_404(Membership, request.tenant, pk=membership_id)
    leaving = membership.pk == request.membership.pk
    if not leaving and not has_capability(request.membership, Capability.MANAGE_MEMBERS):
        raise Http404("Not found.")
    if request.method == "POST":
        try:
            memberships.membership_remove(
                membership=membership, by_membership=request.membership, request=request
            )
        except ServiceError as error:
            messages.error(request, error.message)
            return redirect("members")
        if leaving:
            request.session.pop(SESSION_TENANT_KEY, None)
            messages.success(request, f"You left {request.tenant.name}.")
            return redirect("dashboard")
        messages.success(
            request,
            f"{membership.user.email} was removed; their API tokens for "
            "this organisation are revoked.",
        )
        return redirect("members")
    return render(
        request,
        "partials/confirm.html",
        {
            "title": "Leave organisation" if leaving else "Remove member",
            "message": (
                f"Leave {request.tenant.name}? You lose access to its jobs and costs."
                if leaving
                else f"Remove {membership.user.email} from {request.tenant.name}? Their API tokens "
                "for this organisation stop working at once."
            ),
            "confirm_label": "Leave" if leaving else "Remove",
            "cancel_url": reverse("members"),
        },
    )


@capability_required(Capability.MANAGE_MEMBERS)
@require_POST
def invitation_revoke(request: HttpRequest, invitation_id: int) -> HttpResponse:
    invitation = get_for_tenant_or_404(Invitation, request.tenant, pk=invitation_id)
    invitations.invitation_revoke(invitation=invitation, by_user=request.user, request=request)
    messages.success(request, f"Invitation for {invitation.email} revoked.")
    return redirect("members")


@require_http_methods(["GET", "POST"])
def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    """Public: the link in the e-mail. New people set a password; others sign in first."""
    try:
        invitation = invitations.invitation_for_token(token)
    except ServiceError as error:
        return render(
            request,
            "console/invitation_invalid.html",
            {"reason": error.message},
            status=404 if error.code == ErrorCode.NOT_FOUND else 410,
        )
    form = InvitationSignupForm(request.POST or None)
    account = get_user_model().objects.filter(email__iexact=invitation.email).first()
    # An unverified sign-up for the address is not its owner's: the invitee replaces it.
    existing_account = account is not None and not accounts.awaiting_verification(account)
    if request.method == "POST":
        try:
            if request.user.is_authenticated:
                membership = invitations.invitation_accept(
                    raw_token=token, user=request.user, request=request
                )
            elif existing_account:
                return redirect(f"{reverse('login')}?next={request.path}")
            elif form.is_valid():
                user, membership = accounts.signup_with_invitation(
                    raw_token=token,
                    password=form.cleaned_data["password1"],
                    full_name=form.cleaned_data["full_name"],
                    request=request,
                )
                login(request, user, backend="console.auth_backends.EmailBackend")
            else:
                membership = None
        except ServiceError as error:
            if error.field and error.field in form.fields:
                add_service_error(form, error)
                membership = None
            else:
                messages.error(request, error.message)
                return redirect("dashboard" if request.user.is_authenticated else "login")
        if membership is not None:
            _use_tenant(request, membership.tenant)
            messages.success(
                request, f"You joined {membership.tenant.name} as {membership.get_role_display()}."
            )
            return redirect("dashboard")
    return render(
        request,
        "console/invitation_accept.html",
        {
            "invitation": invitation,
            "form": form,
            "existing_account": existing_account,
        },
    )


# --- API tokens ----


@capability_required(Capability.USE_API_TOKENS)
@require_http_methods(["GET", "POST"])
def api_tokens(request: HttpRequest) -> HttpResponse:
    form = ApiTokenForm(request.POST or None)
    new_token = None
    if request.method == "POST" and form.is_valid():
        try:
            token, raw = tokens.api_token_create(
                user=request.user,
                tenant=request.tenant,
                name=form.cleaned_data["name"],
                request=request,
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            new_token = {"name": token.name, "value": raw}
            form = ApiTokenForm()
    visible = selectors.api_tokens_visible_to(membership=request.membership)
    context = {
        "form": form,
        "new_token": new_token,
        "tokens": Paginator(visible, PAGE_SIZE).get_page(request.GET.get("page")),
        "show_owner": has_capability(request.membership, Capability.MANAGE_TOKENS),
    }
    template = "console/api_tokens.html#token-area" if request.htmx else "console/api_tokens.html"
    return render(request, template, context)


@capability_required(Capability.USE_API_TOKENS)
@require_http_methods(["GET", "POST"])
def api_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_for_tenant_or_404(
        selectors.api_tokens_visible_to(membership=request.membership),
        request.tenant,
        pk=token_id,
    )
    if request.method == "POST":
        tokens.api_token_revoke(token=token, by_user=request.user, request=request)
        messages.success(request, f"Token “{token.name}” revoked; it no longer works.")
        if request.htmx:
            return HttpResponseClientRedirect(reverse("api_tokens"))
        return redirect("api_tokens")
    return render(
        request,
        "partials/confirm.html",
        {
            "title": "Revoke API token",
            "message": f"Revoke “{token.name}” ({token.prefix}…)? Scripts using it stop working "
            "at once. This can't be undone.",
            "confirm_label": "Revoke",
            "cancel_url": reverse("api_tokens"),
        },
    )


# --- audit log ----


@capability_required(Capability.VIEW_AUDIT)
def audit_log(request: HttpRequest) -> HttpResponse:
    action = request.GET.get("action", "").strip()
    actor = request.GET.get("actor", "").strip()
    events = selectors.audit_events_for_tenant(
        tenant=request.tenant, action_prefix=action, actor_query=actor
    )
    context = {
        "events": Paginator(events, PAGE_SIZE).get_page(request.GET.get("page")),
        "action": action,
        "actor": actor,
    }
    template = "console/audit_log.html#audit-table" if request.htmx else "console/audit_log.html"
    return render(request, template, context)


# --- notifications ----


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET", "POST"])
def notifications(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        count = notifications_mark_read(user=request.user, tenant=request.tenant)
        messages.success(
            request, f"{count} notification{'s' if count != 1 else ''} marked as read."
        )
        return redirect("notifications")
    items = selectors.notifications_for(user=request.user, tenant=request.tenant)
    return render(
        request,
        "console/notifications.html",
        {"notifications": Paginator(items, PAGE_SIZE).get_page(request.GET.get("page"))},
    )


# --- password ----


class PasswordChangeView(auth_views.PasswordChangeView):
    template_name = "registration/password_change.html"

    def form_valid(self, form):
        response = super().form_valid(form)
        audit.audit_record(
            action="auth.password_changed",
            tenant=None,
            actor=self.request.user,
            target=self.request.user,
            request=self.request,
        )
        messages.success(self.request, "Password changed.")
        return response

    def get_success_url(self):
        return reverse("dashboard")


# --- platform staff ----


@staff_required
@require_http_methods(["GET", "POST"])
def staff_tenants(request: HttpRequest) -> HttpResponse:
    form = TenantForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            tenant = tenants.tenant_create(
                name=form.cleaned_data["name"], owner=request.user, request=request
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            messages.success(
                request, f"{tenant.name} created with you as owner; invite its people from Members."
            )
            return redirect("staff_tenant_detail", tenant_slug=tenant.slug)
    page = Paginator(selectors.tenants_for_staff(), PAGE_SIZE).get_page(request.GET.get("page"))
    # Columns the rooms above add (billing: spend, balance due, credit), for this page's rows.
    cells = staff_tenant_cells(list(page))
    return render(
        request,
        "console/staff_tenants.html",
        {
            "tenants": page,
            "rows": [(tenant, cells[tenant.pk]) for tenant in page],
            "extra_columns": staff_column_headers(),
            "form": form,
        },
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_tenant_detail(request: HttpRequest, tenant_slug: str) -> HttpResponse:
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None:
        raise Http404("Not found.")
    if request.method == "POST" and "may_run_on_host" in request.POST:
        allowed = request.POST["may_run_on_host"] == "on"
        try:
            host_access.tenant_set_may_run_on_host(
                tenant=tenant, allowed=allowed, user=request.user, request=request
            )
        except ServiceError as error:
            messages.error(request, error.message)
        else:
            messages.success(
                request,
                f"{tenant.name} {'may now run' if allowed else 'may no longer run'} jobs "
                "on this host.",
            )
        return redirect("staff_tenant_detail", tenant_slug=tenant.slug)
    return render(
        request,
        "console/staff_tenant_detail.html",
        {
            "tenant": tenant,
            "host_isolation": host_access.host_isolation(),
            "members": selectors.members_for_tenant(tenant=tenant),
            "events": selectors.audit_events_for_tenant(tenant=tenant)[:20],
            "panels": [
                render_to_string(panel.template_name, panel.context, request=request)
                for panel in staff_panels(request, tenant)
            ],
        },
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_tenant_suspend(request: HttpRequest, tenant_slug: str) -> HttpResponse:
    """Suspending asks for a reason, so it is this small form rather than a bare confirm."""
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None:
        raise Http404("Not found.")
    form = TenantSuspendForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            tenant_admin.tenant_suspend(
                tenant=tenant,
                reason=form.cleaned_data["reason"],
                user=request.user,
                request=request,
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            messages.success(request, f"{tenant.name} is suspended; its running jobs are pausing.")
            target = reverse("staff_tenant_detail", args=[tenant.slug])
            return HttpResponseClientRedirect(target) if request.htmx else redirect(target)
    return render(request, "console/staff_tenant_suspend.html", {"tenant": tenant, "form": form})


@staff_required
@require_http_methods(["GET", "POST"])
def staff_tenant_reactivate(request: HttpRequest, tenant_slug: str) -> HttpResponse:
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None:
        raise Http404("Not found.")
    detail_url = reverse("staff_tenant_detail", args=[tenant.slug])
    return confirm_then_act(
        request,
        title=f"Reactivate {tenant.name}?",
        message=(
            "Its members may launch again. Jobs the suspension paused stay paused until "
            "their users resume them."
        ),
        confirm_label="Reactivate",
        danger=False,
        act=lambda: tenant_admin.tenant_reactivate(
            tenant=tenant, user=request.user, request=request
        ),
        success_url=detail_url,
        success_message=f"{tenant.name} is active again.",
        cancel_url=detail_url,
    )
