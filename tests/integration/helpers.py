"""Shared steps of the integration tests."""

from __future__ import annotations

import httpx


def sign_in(client: httpx.Client, email: str, password: str) -> httpx.Response:
    """Sign in through the real form, CSRF included, as a browser would.

    Returns the POST's response (302 to the dashboard when it worked); the client keeps
    the session cookie.
    """
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    csrf_token = client.cookies.get("csrftoken")
    assert csrf_token, "the sign-in page set no csrftoken cookie"
    return client.post(
        "/accounts/login/",
        data={"username": email, "password": password, "csrfmiddlewaretoken": csrf_token},
    )
