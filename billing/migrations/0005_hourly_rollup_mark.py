from datetime import UTC, timedelta

from django.db import migrations, models
from django.utils import timezone


def mark_from_next_hour(apps, schema_editor):
    """Where ticks kept hourly rows up to date (the running hour's too), they are complete
    for all records so far: records of the running hour still arriving are added
    directly, and hours from the next one on are rolled when they close. A database
    without hourly rows needs no mark (the first tick rolls every closed hour)."""
    if not apps.get_model("billing", "UsageRollup").objects.filter(bucket="hour").exists():
        return
    now = timezone.now().astimezone(UTC)
    next_hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    apps.get_model("billing", "HourlyRollupMark").objects.create(rolled_until=next_hour)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0004_ledger_without_fk_checks"),
    ]

    operations = [
        migrations.CreateModel(
            name="HourlyRollupMark",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("rolled_until", models.DateTimeField()),
            ],
        ),
        migrations.RunPython(mark_from_next_hour, migrations.RunPython.noop),
    ]
