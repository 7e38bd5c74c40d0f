"""Budgets pages: the list with this month's spend and a form to add one (every member
sees it; owners, admins and finance manage), edit, delete and the webhook secret's
rotation. Thin: parse, call the budget services and selectors, render."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from billing.budgets import selectors, services
from billing.budgets.forms import BudgetForm
from billing.models import Budget
from console.confirm import confirm_then_act
from console.forms import add_service_error
from console.permissions import Capability, capability_required, has_capability
from console.service_errors import ServiceError
from console.tenancy import get_for_tenant_or_404

# A new webhook secret travels to the next page in the server-side session (not in a
# message cookie) and is popped when shown: it is readable exactly once.
NEW_SECRET_SESSION_KEY = "billing.new_webhook_secret"


def _show_secret_once(request: HttpRequest, budget: Budget) -> None:
    if budget.new_webhook_secret:
        request.session[NEW_SECRET_SESSION_KEY] = {
            "budget": budget.name,
            "secret": budget.new_webhook_secret,
        }


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET", "POST"])
def budgets(request: HttpRequest) -> HttpResponse:
    can_manage = has_capability(request.membership, Capability.MANAGE_BUDGETS)
    form = BudgetForm(request.POST or None)
    if request.method == "POST":
        if not can_manage:
            return HttpResponse(status=403)
        if form.is_valid():
            try:
                budget = services.budget_create(
                    tenant=request.tenant, user=request.user, request=request, **form.cleaned_data
                )
            except ServiceError as error:
                add_service_error(form, error)
            else:
                messages.success(request, f"Budget “{budget.name}” created.")
                _show_secret_once(request, budget)
                return redirect("billing:budgets")
    return render(
        request,
        "billing/budgets/list.html",
        {
            "form": form,
            "can_manage": can_manage,
            "alerts": selectors.budget_alerts_recent(tenant=request.tenant),
            "statuses": selectors.budget_statuses(tenant=request.tenant),
            "new_webhook_secret": request.session.pop(NEW_SECRET_SESSION_KEY, None),
        },
    )


@capability_required(Capability.MANAGE_BUDGETS)
@require_http_methods(["GET", "POST"])
def budget_edit(request: HttpRequest, budget_id: int) -> HttpResponse:
    budget = get_for_tenant_or_404(Budget, request.tenant, pk=budget_id)
    initial = {
        "name": budget.name,
        "amount": budget.amount,
        "action": budget.action,
        "thresholds": ", ".join(str(t) for t in budget.thresholds),
        "project": budget.project,
        "webhook_url": budget.webhook_url,
    }
    form = BudgetForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.budget_update(
                budget=budget, user=request.user, request=request, **form.cleaned_data
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            messages.success(request, f"Budget “{budget.name}” saved.")
            _show_secret_once(request, budget)
            return redirect("billing:budgets")
    return render(request, "billing/budgets/edit.html", {"form": form, "budget": budget})


@capability_required(Capability.MANAGE_BUDGETS)
@require_http_methods(["POST"])
def budget_rotate_webhook_secret(request: HttpRequest, budget_id: int) -> HttpResponse:
    budget = get_for_tenant_or_404(Budget, request.tenant, pk=budget_id)
    try:
        services.budget_webhook_secret_rotate(budget=budget, user=request.user, request=request)
    except ServiceError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Webhook secret of “{budget.name}” rotated.")
        _show_secret_once(request, budget)
    return redirect("billing:budgets")


@capability_required(Capability.MANAGE_BUDGETS)
@require_http_methods(["GET", "POST"])
def budget_delete(request: HttpRequest, budget_id: int) -> HttpResponse:
    budget = get_for_tenant_or_404(Budget, request.tenant, pk=budget_id)
    return confirm_then_act(
        request,
        title="Delete budget",
        message=f"Delete “{budget.name}”? Jobs it paused will resume and its alerts stop.",
        confirm_label="Delete",
        act=lambda: services.budget_delete(budget=budget, user=request.user, request=request),
        success_url=reverse("billing:budgets"),
        success_message=f"Budget “{budget.name}” deleted; jobs it paused resume.",
        cancel_url=reverse("billing:budgets"),
    )
