from __future__ import annotations

from django import forms
from django.contrib.auth.forms import AuthenticationForm

from console.permissions import Role


class EmailAuthenticationForm(AuthenticationForm):
    """Django's sign-in form; the `username` field holds the e-mail."""

    username = forms.EmailField(
        label="E-mail", widget=forms.EmailInput(attrs={"autofocus": True, "autocomplete": "email"})
    )
    error_messages = {
        **AuthenticationForm.error_messages,
        "invalid_login": "E-mail or password is wrong. Both are case-sensitive except the e-mail.",
    }


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


class TenantForm(forms.Form):
    name = forms.CharField(label="Organisation name", max_length=120)
