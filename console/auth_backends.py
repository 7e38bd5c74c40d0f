"""Sign-in by e-mail, case-insensitively."""

from django.contrib.auth.backends import ModelBackend


class EmailBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        email = username or kwargs.get("email")
        if email is None or password is None:
            return None
        return super().authenticate(request, username=email.strip().lower(), password=password)
