"""JobEvent.actor (a free string: a user's e-mail, "system", "budget", …) becomes a typed
kind and, for a person, a foreign key to the user."""

from django.conf import settings
from django.db import migrations, models
import django.db.models.deletion

# The labels the console wrote, as of this migration (jobs/actors.py).
KIND_OF_LABEL = {
    "system": "system",
    "backend": "backend",
    "budget": "budget",
    "alerts": "alert",
    "suspension": "suspension",
}
LABEL_OF_KIND = {kind: label for label, kind in KIND_OF_LABEL.items()}


def labels_to_kinds(apps, schema_editor):
    """One UPDATE per distinct label: an e-mail becomes its user where the account still
    exists (a user event without a user where it doesn't)."""
    JobEvent = apps.get_model("jobs", "JobEvent")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    for label in JobEvent.objects.values_list("actor", flat=True).distinct().order_by():
        events = JobEvent.objects.filter(actor=label)
        if label in KIND_OF_LABEL:
            events.update(actor_kind=KIND_OF_LABEL[label])
        elif "@" in label:
            user = User.objects.filter(email__iexact=label).order_by("pk").first()
            events.update(actor_kind="user", actor_user=user)
        else:  # nothing else was ever written; the console's, if it were
            events.update(actor_kind="system")


def kinds_to_labels(apps, schema_editor):
    JobEvent = apps.get_model("jobs", "JobEvent")
    for kind, label in LABEL_OF_KIND.items():
        JobEvent.objects.filter(actor_kind=kind).update(actor=label)
    users = JobEvent.objects.filter(actor_kind="user").exclude(actor_user=None)
    for user_id, email in users.values_list("actor_user", "actor_user__email").distinct():
        JobEvent.objects.filter(actor_kind="user", actor_user=user_id).update(actor=email)
    JobEvent.objects.filter(actor_kind="user", actor_user=None).update(actor="deleted user")


class Migration(migrations.Migration):

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("jobs", "0009_job_dispatch_claim"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobevent",
            name="actor_kind",
            field=models.CharField(
                choices=[
                    ("user", "A person"),
                    ("budget", "A budget"),
                    ("alert", "An alert rule"),
                    ("system", "The console"),
                    ("backend", "The compute backend"),
                    ("suspension", "A tenant suspension"),
                ],
                default="system",
                max_length=16,
            ),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="jobevent",
            name="actor_user",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="jobevent",
            name="actor",
            field=models.CharField(blank=True, default="", max_length=254),
        ),
        migrations.RunPython(labels_to_kinds, kinds_to_labels),
        migrations.RemoveField(model_name="jobevent", name="actor"),
    ]
