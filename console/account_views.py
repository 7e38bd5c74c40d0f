"""Sign-in, sign-up, e-mail verification and password reset pages, and django-axes' hooks.

Thin like every view: the sign-up policy, tokens and mails live in `console.registration`.
"""

from __future__ import annotations

from axes.attempts import get_cool_off_threshold
from axes.models import AccessAttempt, AccessBase
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from console import registration, selectors
from console.api.errors import json_error
from console.forms import (
    EmailAuthenticationForm,
    SignupForm,
    SignupVerifyForm,
    WorkerPasswordResetForm,
    add_service_error,
)
from console.service_errors import ServiceError
from console.services.audit import audit_record
from console.views import _use_tenant


def _verify_link_for(request: HttpRequest):
    return lambda uidb64, token: request.build_absolute_uri(
        reverse("signup_verify", args=[uidb64, token])
    )


class LoginView(auth_views.LoginView):
    form_class = EmailAuthenticationForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "signup_policy": settings.SIGNUP}

    def form_invalid(self, form):
        if form.user_awaiting_verification is not None:
            registration.verification_resend(
                user=form.user_awaiting_verification, verify_link_for=_verify_link_for(self.request)
            )
        return super().form_invalid(form)


def axes_lockout_parameters(request_or_attempt, credentials=None) -> list[list[str]]:
    """django-axes' counters (AXES_LOCKOUT_PARAMETERS): failures count per account and IP,
    so one person's typos never lock out their neighbours; once one address has failed
    AXES_IP_FAILURE_LIMIT times across all accounts within the cool-off (password
    spraying), axes counts by the IP alone and refuses every account from it."""
    per_account = [["username", "ip_address"]]
    ip_address = getattr(request_or_attempt, "axes_ip_address", None)
    if isinstance(request_or_attempt, AccessBase) or not ip_address:
        return per_account
    failures = AccessAttempt.objects.filter(
        ip_address=ip_address, attempt_time__gte=get_cool_off_threshold(request_or_attempt)
    ).aggregate(total=Sum("failures_since_start"))["total"]
    return [["ip_address"]] if (failures or 0) >= settings.AXES_IP_FAILURE_LIMIT else per_account


def lockout_response(request: HttpRequest, original_response=None, credentials=None):
    """django-axes' response to too many failed sign-ins (per account and IP, or per IP)."""
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    whom = (
        ""
        if axes_lockout_parameters(request, credentials) == [["ip_address"]]
        else " for this account"
    )
    detail = (
        f"Too many failed sign-in attempts{whom} from your address. Try again in {minutes} minutes."
    )
    if request.path.startswith("/api/"):
        return json_error(429, detail, "locked_out")
    form = EmailAuthenticationForm(request)
    context = {"form": form, "lockout": detail, "signup_policy": settings.SIGNUP}
    return render(request, "registration/login.html", context, status=429)


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    """Open sign-up. With SIGNUP `invite` or `closed` the page says so and refuses a POST."""
    if request.user.is_authenticated:
        return redirect("dashboard")
    if not registration.signup_open():
        context = {"closed_message": registration.signup_closed_message()}
        status = 403 if request.method == "POST" else 200
        return render(request, "registration/signup.html", context, status=status)
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            registration.user_signup(
                email=form.cleaned_data["email"],
                password=form.cleaned_data["password1"],
                organisation_name=form.cleaned_data["organisation_name"],
                full_name=form.cleaned_data["full_name"],
                verify_link_for=_verify_link_for(request),
                sign_in_url=request.build_absolute_uri(reverse("login")),
                reset_url=request.build_absolute_uri(reverse("password_reset")),
                request=request,
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            # The same answer whether or not the address had an account.
            return redirect("signup_sent")
    return render(request, "registration/signup.html", {"form": form})


def signup_sent(request: HttpRequest) -> HttpResponse:
    return render(request, "registration/signup_sent.html")


@require_http_methods(["GET", "POST"])
def signup_verify(request: HttpRequest, uidb64: str, token: str) -> HttpResponse:
    """The link in the verification e-mail. GET shows a form (mail scanners follow links
    but don't submit forms); POST, with the password chosen at sign-up, activates the
    account and signs the person in."""
    template = "registration/signup_verify.html"
    form = SignupVerifyForm(request.POST or None)
    if request.method == "GET" or not form.is_valid():
        if registration.verification_link_user(uidb64=uidb64, token=token) is None:
            return render(request, template, {"invalid": registration.INVALID_LINK}, status=400)
        return render(request, template, {"form": form})
    try:
        user = registration.account_verify(
            uidb64=uidb64, token=token, password=form.cleaned_data["password"], request=request
        )
    except ServiceError as error:
        if error.field in form.fields:
            add_service_error(form, error)
            return render(request, template, {"form": form})
        return render(request, template, {"invalid": error.message}, status=400)
    login(request, user, backend="console.auth_backends.EmailBackend")
    membership = selectors.memberships_of_user(user=user).first()
    if membership is not None:
        _use_tenant(request, membership.tenant)
        messages.success(request, f"Welcome! {membership.tenant.name} is ready.")
    return redirect("dashboard")


class PasswordResetView(auth_views.PasswordResetView):
    """Same page and status for every address: the e-mail goes only to an active account."""

    form_class = WorkerPasswordResetForm
    template_name = "registration/password_reset_form.html"
    email_template_name = "registration/password_reset_email.txt"
    subject_template_name = "registration/password_reset_subject.txt"


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    template_name = "registration/password_reset_confirm.html"

    def form_valid(self, form):
        response = super().form_valid(form)
        audit_record(
            action="auth.password_reset",
            actor=form.user,
            target=form.user,
            request=self.request,
        )
        return response
