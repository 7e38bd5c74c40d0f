"""Sign-in and sign-out go to the audit log (Django's auth signals, so every path counts);
console's own signals for the rooms above it."""

from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import Signal, receiver

from console.services.audit import audit_record

# A person's access to an organisation changed (removed, role changed): sent with
# `tenant_id` and `user_id`. Sockets are checked once at connect; jobs' realtime tells the
# person's open ones to check again (console can't import jobs).
membership_changed = Signal()


@receiver(user_logged_in)
def _audit_sign_in(sender, request, user, **kwargs):
    audit_record(action="auth.signed_in", actor=user, target=user, request=request)


@receiver(user_logged_out)
def _audit_sign_out(sender, request, user, **kwargs):
    if user is not None:
        audit_record(action="auth.signed_out", actor=user, target=user, request=request)


@receiver(user_login_failed)
def _audit_sign_in_failed(sender, credentials, request=None, **kwargs):
    audit_record(
        action="auth.sign_in_failed",
        actor_label=str(credentials.get("username") or credentials.get("email") or "")[:254],
        request=request,
    )
