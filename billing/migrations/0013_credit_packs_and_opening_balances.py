"""Three starter credit packs (staff edit them in the admin), and an opening movement for
every credit balance that existed before the credit ledger, so each tenant's movements
sum to its balance from now on."""

from decimal import Decimal

from django.db import migrations

PACKS = [
    ("Starter credit", Decimal("100.00")),
    ("Team credit", Decimal("500.00")),
    ("Lab credit", Decimal("2000.00")),
]


def seed(apps, schema_editor):
    CreditPack = apps.get_model("billing", "CreditPack")
    if not CreditPack.objects.exists():
        CreditPack.objects.bulk_create(
            CreditPack(name=name, amount=amount, currency="USD", position=position)
            for position, (name, amount) in enumerate(PACKS)
        )
    TenantBillingProfile = apps.get_model("billing", "TenantBillingProfile")
    CreditMovement = apps.get_model("billing", "CreditMovement")
    for profile in TenantBillingProfile.objects.exclude(credit_balance=0):
        CreditMovement.objects.create(
            tenant_id=profile.tenant_id,
            kind="opening",
            amount=profile.credit_balance,
            balance_after=profile.credit_balance,
            description="Balance before the credit history was kept",
        )


class Migration(migrations.Migration):
    dependencies = [("billing", "0012_stripe_and_credits")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
