"""Confirm-then-act: the one way a page asks before a destructive action.

GET renders the shared `partials/confirm.html`; POST runs the action, flashes the outcome
and redirects (an htmx POST gets an HX-Redirect instead of a 302 it would follow inline).
A refused action (ServiceError) becomes an error message and goes back to `cancel_url`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django_htmx.http import HttpResponseClientRedirect

from console.service_errors import ServiceError


def confirm_then_act(
    request: HttpRequest,
    *,
    title: str,
    message: str,
    confirm_label: str,
    act: Callable[[], object],
    success_url: str | Callable[[Any], str],
    success_message: str,
    cancel_url: str,
    details: list[str] | None = None,
    danger: bool = True,
    alternative: tuple[str, str] | None = None,
) -> HttpResponse:
    """The view keeps its decorators (permission, `require_http_methods(["GET", "POST"])`)
    and the object lookup; this does the asking and the acting. `details` lists what the
    action hits; `danger=False` for an action that undoes a restriction (a primary
    button, not a red one); `alternative` is another way on, as (label, url)."""
    if request.method != "POST":
        return render(
            request,
            "partials/confirm.html",
            {
                "title": title,
                "message": message,
                "confirm_label": confirm_label,
                "cancel_url": cancel_url,
                "details": details or [],
                "danger": danger,
                "alternative": alternative,
            },
        )
    try:
        result = act()
    except ServiceError as error:
        messages.error(request, error.message)
        target = cancel_url
    else:
        messages.success(request, success_message)
        target = success_url(result) if callable(success_url) else success_url
    if getattr(request, "htmx", False):
        return HttpResponseClientRedirect(target)
    return redirect(target)
