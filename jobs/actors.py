"""Who acted on a job: a typed value, so rules read its kind rather than parse text.

The timeline stores the kind and, for a person, the user (`JobEvent.actor_kind`,
`actor_user`); `label` (a user's e-mail, "budget", "system"…) is how it reads."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models


class ActorKind(models.TextChoices):
    USER = "user", "A person"
    BUDGET = "budget", "A budget"
    ALERT = "alert", "An alert rule"
    SYSTEM = "system", "The console"
    BACKEND = "backend", "The compute backend"
    SUSPENSION = "suspension", "A tenant suspension"
    PREEMPTION = "preemption", "A higher-priority job"


@dataclass(frozen=True)
class Actor:
    kind: ActorKind
    label: str
    user_id: int | None = None

    @classmethod
    def of_user(cls, user) -> Actor:
        return cls(ActorKind.USER, user.email, user.pk)

    def __str__(self) -> str:
        return self.label


SYSTEM = Actor(ActorKind.SYSTEM, "system")
BACKEND = Actor(ActorKind.BACKEND, "backend")
BUDGET = Actor(ActorKind.BUDGET, "budget")
ALERTS = Actor(ActorKind.ALERT, "alerts")
SUSPENSION = Actor(ActorKind.SUSPENSION, "suspension")
# Admission stopping a job for a higher-priority one: the reason names the preemptor.
PREEMPTION = Actor(ActorKind.PREEMPTION, "preemption")
# Each kind that is not a person acts as one of these.
NON_USER_ACTORS = {
    actor.kind: actor for actor in (SYSTEM, BACKEND, BUDGET, ALERTS, SUSPENSION, PREEMPTION)
}
