"""Signals of storage for the rooms above it (billing meters a volume up to a resize;
services refuse the deletion of a volume their replicas mount)."""

from django.dispatch import Signal

# Sent with `volume` (at its old size) inside the transaction that resizes it, before
# the new size is saved.
volume_resizing = Signal()

# Sent with `volume` inside the transaction that deletes it, before it is marked deleted;
# a receiver refuses the deletion by raising ServiceError (a 409 saying who mounts it).
volume_deleting = Signal()
