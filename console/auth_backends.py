"""Sign-in by e-mail, case-insensitively."""

from django.contrib.auth.backends import ModelBackend

from console.compiled import compiled_first
from console.models import User


def axes_username(request, credentials) -> str:
    """The account django-axes counts failures against: the e-mail, normalised."""
    value = (credentials or {}).get("username") or (credentials or {}).get("email")
    if value is None and request is not None:
        value = request.POST.get("username", "")
    return str(value or "").strip().lower()


class EmailBackend(ModelBackend):
    def get_user(self, user_id):
        # Every signed-in page loads its user: compiled once per process (console.compiled).
        user = compiled_first(
            "session-user", User, lambda at: User._default_manager.filter(pk=at.int("pk")),
            pk=user_id,
        )  # fmt: skip
        return user if user is not None and self.user_can_authenticate(user) else None

    def authenticate(self, request, username=None, password=None, **kwargs):
        email = username or kwargs.get("email")
        if email is None or password is None:
            return None
        return super().authenticate(request, username=email.strip().lower(), password=password)
