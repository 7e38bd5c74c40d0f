"""Signals services send to the rooms above them.

`replicas_removing(sender, replica_ids)` is sent, inside the transaction, just before
replica rows are deleted (a reconcile pass forgetting the replicas it saw stop, a service
deleted): billing meters their time up to their stop first, so none is lost with them.

`service_creating(sender, tenant, priority)` is sent before a service is created; a
receiver refuses it by raising ServiceError (billing: a used-up budget refuses a
non-critical one, as it refuses a non-critical job)."""

from __future__ import annotations

from django.dispatch import Signal

replicas_removing = Signal()
service_creating = Signal()
