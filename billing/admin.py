"""Django admin for what staff set by hand: the credit packs tenants can buy. Stripe's
events are listed read-only, for support."""

from django.contrib import admin

from billing.models import CreditPack, StripeEvent


@admin.register(CreditPack)
class CreditPackAdmin(admin.ModelAdmin):
    list_display = ["name", "amount", "currency", "active", "position"]
    list_editable = ["active", "position"]


@admin.register(StripeEvent)
class StripeEventAdmin(admin.ModelAdmin):
    list_display = ["event_id", "type", "object_id", "outcome", "received_at"]
    search_fields = ["event_id", "object_id"]
    list_filter = ["type"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
