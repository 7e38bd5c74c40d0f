from __future__ import annotations

from typing import Protocol

from django import forms
from django.contrib.auth.forms import AuthenticationForm, PasswordResetForm
from django.core.exceptions import ValidationError
from django.template.loader import render_to_string

from console import registration
from console.models import User
from console.permissions import Role
from console.services.mail import email_send_later


class FieldRefusal(Protocol):
    """A refusal that names the input to blame, if any: a `ServiceError`, a `PricingError`."""

    message: str
    field: str | None


def add_service_error(form: forms.BaseForm, error: FieldRefusal) -> None:
    """Show a service's refusal on the form that asked: beside its field when the form
    has that field, above the form otherwise."""
    form.add_error(error.field if error.field in form.fields else None, error.message)


class EmailAuthenticationForm(AuthenticationForm):
    """Django's sign-in form; the `username` field holds the e-mail."""

    username = forms.EmailField(
        label="E-mail", widget=forms.EmailInput(attrs={"autofocus": True, "autocomplete": "email"})
    )
    error_messages = {
        **AuthenticationForm.error_messages,
        "invalid_login": "E-mail or password is wrong. Both are case-sensitive except the e-mail.",
        "unverified": (
            "Verify your e-mail address first: follow the link we e-mailed you. "
            "We have just sent it again."
        ),
    }
    # The account behind a correct password that still awaits verification, if any.
    user_awaiting_verification: User | None = None

    def clean(self):
        # Django's backends refuse an inactive account like a wrong password, and that
        # refusal is a failed sign-in to django-axes. The right password of an account
        # that only awaits verification is not one: it is answered here, before
        # authenticate(), so it is neither logged as a failure nor counted toward lockout.
        email = self.cleaned_data.get("username") or ""
        password = self.cleaned_data.get("password") or ""
        if email and password:
            outcome, user = registration.sign_in_awaiting_verification(
                request=self.request, email=email, password=password
            )
            if outcome is registration.UnverifiedSignIn.RIGHT_PASSWORD:
                self.user_awaiting_verification = user
                raise ValidationError(self.error_messages["unverified"], code="unverified")
            if outcome is registration.UnverifiedSignIn.WRONG_PASSWORD:
                raise self.get_invalid_login_error()
        return super().clean()


class WorkerPasswordResetForm(PasswordResetForm):
    """Django's password-reset form; the e-mail goes out from the worker like every other,
    so a known and an unknown address take the same time to answer."""

    def send_mail(
        self,
        subject_template_name,
        email_template_name,
        context,
        from_email,
        to_email,
        html_email_template_name=None,
    ):
        subject = "".join(render_to_string(subject_template_name, context).splitlines())
        body = render_to_string(email_template_name, context)
        email_send_later(subject=subject, body=body, recipients=[to_email])


class SignupForm(forms.Form):
    full_name = forms.CharField(label="Your name", max_length=150, required=False)
    email = forms.EmailField(
        label="E-mail", widget=forms.EmailInput(attrs={"autocomplete": "email"})
    )
    organisation_name = forms.CharField(
        label="Organisation", max_length=120, help_text="Your team or company; you'll be its owner."
    )
    password1 = forms.CharField(
        label="Password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )
    password2 = forms.CharField(
        label="Repeat password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("password1") and cleaned.get("password1") != cleaned.get("password2"):
            self.add_error("password2", "The two passwords differ.")
        return cleaned


class SignupVerifyForm(forms.Form):
    """The verification link's form: the password chosen at sign-up activates it."""

    password = forms.CharField(
        label="Your password",
        strip=False,
        help_text="The one you chose when you signed up.",
        widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}),
    )


class InvitationSignupForm(forms.Form):
    full_name = forms.CharField(label="Your name", max_length=150, required=False)
    password1 = forms.CharField(
        label="Password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )
    password2 = forms.CharField(
        label="Repeat password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("password1") and cleaned.get("password1") != cleaned.get("password2"):
            self.add_error("password2", "The two passwords differ.")
        return cleaned


class InvitationForm(forms.Form):
    email = forms.EmailField(label="E-mail")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class ApiTokenForm(forms.Form):
    name = forms.CharField(
        label="Token name",
        max_length=100,
        widget=forms.TextInput(attrs={"placeholder": "e.g. ci-pipeline"}),
    )


class SshKeyForm(forms.Form):
    """The key is validated by the service (console.ssh_public_keys), not here, so the
    page and the API refuse the same things with the same words."""

    public_key = forms.CharField(
        label="Public key",
        max_length=8192,
        strip=True,
        widget=forms.Textarea(
            attrs={
                "rows": 4,
                "spellcheck": "false",
                "autocomplete": "off",
                "placeholder": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA… you@laptop",
            }
        ),
        help_text="The one line in your .pub file, e.g. ~/.ssh/id_ed25519.pub. "
        "Never the private key.",
    )
    title = forms.CharField(
        label="Title",
        max_length=100,
        required=False,
        help_text="Optional; defaults to the key's comment (often you@laptop).",
    )


class TenantForm(forms.Form):
    name = forms.CharField(label="Organisation name", max_length=120)


class TenantSuspendForm(forms.Form):
    reason = forms.CharField(
        label="Reason (shown to its members)",
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 3}),
    )


class OrganisationSettingsForm(forms.Form):
    hardware_repair_default = forms.BooleanField(
        label="Requeue a job on another node when its GPU reports a hardware fault or a rank "
        "is stuck",
        required=False,
        help_text="The job checkpoints, the node is marked suspect, and the job resumes "
        "elsewhere from its latest checkpoint. Off: the job is alerted and keeps running.",
    )
    loss_explosion_pause_default = forms.BooleanField(
        label="Pause a job whose loss explodes",
        required=False,
        help_text="A logged loss above the run's mean + 3σ (or NaN) pauses the job and "
        "tells its owner. Off: the job is alerted and keeps running.",
    )
