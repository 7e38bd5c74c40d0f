"""Sign-in and sign-out go to the audit log (Django's auth signals, so every path counts);
console's own signals for the rooms above it; and a change to a token, membership, user,
organisation or notification drops what the cache kept of it."""

from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import post_delete, post_save
from django.dispatch import Signal, receiver

from console.caching import forget
from console.models import ApiToken, Membership, Notification, Tenant, User
from console.selectors import memberships_cache_key, unread_cache_key
from console.services.audit import audit_record
from console.token_lookup import forget_tokens

# A person's access to an organisation changed (removed, role changed): sent with
# `tenant_id` and `user_id`. Sockets are checked once at connect; jobs' realtime tells the
# person's open ones to check again (console can't import jobs).
membership_changed = Signal()
# An organisation was created (by sign-up or by staff): sent with `tenant`, inside the
# transaction that created it, for the rooms above to give it their starting state
# (the marketplace: the default quota of new organisations).
tenant_created = Signal()


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


# --- what the cache keeps (console.caching), dropped when its rows change ----


@receiver([post_save, post_delete], sender=ApiToken)
def _forget_token(sender, instance: ApiToken, **kwargs):
    forget_tokens([instance.key_hash])


@receiver([post_save, post_delete], sender=Membership)
def _forget_membership(sender, instance: Membership, **kwargs):
    # Joined, left or a new role: the switcher's list and the user's tokens there.
    forget([memberships_cache_key(instance.user_id)])
    tokens = ApiToken.objects.filter(user_id=instance.user_id, tenant_id=instance.tenant_id)
    forget_tokens(tokens.values_list("key_hash", flat=True))


@receiver(post_save, sender=User)
def _forget_user_tokens(sender, instance: User, created: bool, update_fields=None, **kwargs):
    if created or (update_fields is not None and set(update_fields) <= {"last_login"}):
        return  # no token yet, or a sign-in: nothing a token reads changed
    forget_tokens(ApiToken.objects.filter(user_id=instance.pk).values_list("key_hash", flat=True))


@receiver(post_save, sender=Tenant)
def _forget_tenant(sender, instance: Tenant, created: bool, **kwargs):
    if created:
        return
    members = Membership.objects.filter(tenant_id=instance.pk).values_list("user_id", flat=True)
    forget(memberships_cache_key(user_id) for user_id in members)
    tokens = ApiToken.objects.filter(tenant_id=instance.pk)
    forget_tokens(tokens.values_list("key_hash", flat=True))


@receiver([post_save, post_delete], sender=Notification)
def _forget_unread_count(sender, instance: Notification, **kwargs):
    forget([unread_cache_key(instance.user_id, instance.tenant_id)])
