"""The account page of a person's SSH public keys (`/account/ssh-keys/`): list, add,
delete. Thin: console.services.ssh_keys validates and writes, console.selectors reads,
and only the signed-in person's own keys are ever looked up (another's id is a 404)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from console import selectors
from console.confirm import confirm_then_act
from console.forms import SshKeyForm, add_service_error
from console.service_errors import ServiceError
from console.services import ssh_keys

PAGE_TEMPLATE = "console/ssh_keys.html"


@login_required
@require_http_methods(["GET", "POST"])
def ssh_key_list(request: HttpRequest) -> HttpResponse:
    form = SshKeyForm(request.POST or None)
    added = None
    if request.method == "POST" and form.is_valid():
        try:
            added = ssh_keys.ssh_key_add(
                user=request.user,
                public_key=form.cleaned_data["public_key"],
                title=form.cleaned_data["title"],
                request=request,
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            if not request.htmx:
                messages.success(request, f"SSH key “{added.title}” added.")
                return redirect("ssh_keys")
            form = SshKeyForm()
    context = {
        "form": form,
        "added": added,
        "keys": selectors.ssh_keys_of_user(user=request.user),
        "max_keys": ssh_keys.MAX_KEYS_PER_USER,
    }
    if request.htmx:  # htmx swaps only 2xx answers: the refused form comes back as 200
        return render(request, f"{PAGE_TEMPLATE}#ssh-key-area", context)
    return render(request, PAGE_TEMPLATE, context, status=400 if form.errors else 200)


@login_required
@require_http_methods(["GET", "POST"])
def ssh_key_delete(request: HttpRequest, key_id: int) -> HttpResponse:
    key = selectors.ssh_keys_of_user(user=request.user).filter(pk=key_id).first()
    if key is None:
        raise Http404("No such SSH key.")
    return confirm_then_act(
        request,
        title="Delete SSH key",
        message=f"Delete “{key.title}”? Connections with this key are refused from then on; "
        "sessions already open are not cut. This can't be undone.",
        details=[f"{key.type_label} {key.fingerprint}"],
        confirm_label="Delete key",
        act=lambda: ssh_keys.ssh_key_delete(key=key, request=request),
        success_url=reverse("ssh_keys"),
        success_message=f"SSH key “{key.title}” deleted.",
        cancel_url=reverse("ssh_keys"),
    )
