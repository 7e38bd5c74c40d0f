"""Signals the marketplace sends for the rooms above it to act on."""

from django.dispatch import Signal

# A tenant removed its login to a registry: sent with `tenant_id` and `registry`, inside
# the transaction that deleted it. (Jobs removes the copies its backends hold.)
registry_credential_removed = Signal()
