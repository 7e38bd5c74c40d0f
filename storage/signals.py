"""Signals of storage for the rooms above it (billing meters a volume up to a resize)."""

from django.dispatch import Signal

# Sent with `volume` (at its old size) inside the transaction that resizes it, before
# the new size is saved.
volume_resizing = Signal()
