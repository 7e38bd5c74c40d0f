"""Credit notes pushed to Stripe. Notes made before their invoice's Stripe items were
planned are billed by that invoice's "Credit notes" item: they are marked so, and never
sent as Stripe credit notes (later ones are, by the reconciler)."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


def mark_billed_by_their_invoice(apps, schema_editor):
    CreditNote = apps.get_model("billing", "CreditNote")
    StripeCreditNote = apps.get_model("billing", "StripeCreditNote")
    notes = CreditNote.objects.filter(invoice__stripe__isnull=False).select_related(
        "invoice__stripe"
    )
    StripeCreditNote.objects.bulk_create(
        StripeCreditNote(
            credit_note=note,
            in_invoice=True,
            # The format of billing.payments.client.idempotency_key (never sent: unique only).
            idempotency_key=f"gpugeek:{settings.GPUGEEK_INSTALLATION_ID}:credit-note:{note.number}",
        )
        for note in notes
        if note.created_at <= note.invoice.stripe.created_at
    )


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0013_credit_packs_and_opening_balances'),
    ]

    operations = [
        migrations.CreateModel(
            name='StripeCreditNote',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('idempotency_key', models.CharField(max_length=255, unique=True)),
                ('in_invoice', models.BooleanField(default=False)),
                ('stripe_credit_note_id', models.CharField(blank=True, max_length=255)),
                ('sent_at', models.DateTimeField(blank=True, null=True)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('last_attempt_at', models.DateTimeField(blank=True, null=True)),
                ('last_error', models.CharField(blank=True, max_length=500)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('credit_note', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='stripe', to='billing.creditnote')),
            ],
        ),
        migrations.RunPython(mark_billed_by_their_invoice, migrations.RunPython.noop),
    ]
