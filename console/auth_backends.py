"""Sign-in by e-mail, case-insensitively."""

from django.contrib.auth.backends import ModelBackend


def axes_username(request, credentials) -> str:
    """The account django-axes counts failures against: the e-mail, normalised."""
    value = (credentials or {}).get("username") or (credentials or {}).get("email")
    if value is None and request is not None:
        value = request.POST.get("username", "")
    return str(value or "").strip().lower()


class EmailBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        email = username or kwargs.get("email")
        if email is None or password is None:
            return None
        return super().authenticate(request, username=email.strip().lower(), password=password)
