"""Payment pages and the Stripe webhook endpoint. Thin: parse, call a service or
selector, render."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from billing.payments import credits, selectors, webhook
from billing.payments.client import stripe_configured
from console.permissions import Capability, capability_required
from console.service_errors import ServiceError
from marketplace.selectors import price_currency


@csrf_exempt  # Stripe signs the body instead; no session or cookie is involved
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    try:
        outcome = webhook.stripe_webhook_receive(
            payload=request.body, signature=request.headers.get("Stripe-Signature")
        )
    except webhook.WebhookRejected as error:
        return JsonResponse({"detail": error.message}, status=400)
    return JsonResponse(
        {"received": True, "event": outcome.event_id, "duplicate": outcome.duplicate}
    )


class BuyCreditForm(forms.Form):
    pack = forms.ModelChoiceField(queryset=selectors.credit_packs_offered())


@capability_required(Capability.VIEW_INVOICES)
def credit(request: HttpRequest) -> HttpResponse:
    tenant = request.tenant  # type: ignore[attr-defined]
    if request.GET.get("checkout") == "success":
        messages.info(
            request,
            "Thank you: Stripe has your payment. The credit appears here as soon as Stripe "
            "confirms it (usually within a minute).",
        )
    return render(
        request,
        "billing/credit.html",
        {
            "balance": selectors.credit_balance(tenant=tenant),
            # Credit is held in the price book's currency (it pays invoices in it).
            "currency": price_currency(),
            "movements": list(selectors.credit_movements(tenant=tenant)[: selectors.HISTORY]),
            "packs": list(selectors.credit_packs_offered()),
            "pending": list(selectors.credit_purchases_pending(tenant=tenant)[:10]),
            "stripe_configured": stripe_configured(),
        },
    )


@require_POST
@capability_required(Capability.BUY_CREDIT)
def credit_buy(request: HttpRequest) -> HttpResponse:
    form = BuyCreditForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose one of the credit packs on offer.")
        return redirect("billing:credit")
    page = request.build_absolute_uri(reverse("billing:credit"))
    try:
        purchase = credits.credit_checkout_start(
            tenant=request.tenant,  # type: ignore[attr-defined]
            pack=form.cleaned_data["pack"],
            user=request.user,  # type: ignore[arg-type]
            success_url=f"{page}?checkout=success",
            cancel_url=page,
        )
    except ServiceError as error:
        messages.error(request, error.message)
        return redirect("billing:credit")
    if not purchase.checkout_url:
        messages.error(request, "Stripe gave no payment page; nothing was charged.")
        return redirect("billing:credit")
    return HttpResponseRedirect(purchase.checkout_url)  # Stripe's hosted payment page
