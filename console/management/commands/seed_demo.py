"""Demo data: a platform admin, two tenants with their people, the marketplace catalog,
and 60 days of the tenants' past jobs with their usage (`billing.demo_history`). Safe to
run twice."""

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction

from billing.demo_history import seed_demo_history
from console.models import Membership, Tenant, User
from console.permissions import Role
from jobs.backends.local import LocalBackend
from marketplace.demo import seed_catalog
from marketplace.services import capacity_sync

DEMO_TENANTS = [
    (
        "Acme",
        "acme",
        [
            ("alice@acme.example", "Alice Owner", Role.OWNER),
            ("dev@acme.example", "Dev Member", Role.MEMBER),
            ("fin@acme.example", "Fin Finance", Role.FINANCE),
        ],
    ),
    ("Globex", "globex", [("bob@globex.example", "Bob Owner", Role.OWNER)]),
]
STAFF_EMAIL = "admin@example.com"


HOST_DEMO_TENANT = "acme"


class Command(BaseCommand):
    help = "Create the demo staff user, tenants Acme and Globex and their members."

    def add_arguments(self, parser):
        parser.add_argument(
            "--if-empty",
            action="store_true",
            help="Do nothing when any user exists (first start only).",
        )
        parser.add_argument(
            "--no-history",
            action="store_true",
            help="Skip the tenants' 60 days of past jobs and their usage.",
        )

    @transaction.atomic
    def handle(self, *args, if_empty=False, no_history=False, **options):
        if if_empty and User.objects.exists():
            self.stdout.write("Users exist already; demo data not seeded.")
            return
        password = settings.DEMO_PASSWORD
        staff, created = User.objects.get_or_create(
            email=STAFF_EMAIL,
            defaults={"is_staff": True, "is_superuser": True, "full_name": "Platform Admin"},
        )
        if created:
            staff.set_password(password)
            staff.save()
        rows = [(STAFF_EMAIL, "platform staff", "—")]
        tenants = []
        for name, slug, people in DEMO_TENANTS:
            # Acme may run on "This host" (the local backend); staff allow any other
            # organisation on its staff page (a second one only where host jobs are
            # sandboxed: console.host_access).
            tenant, _ = Tenant.objects.get_or_create(
                slug=slug, defaults={"name": name, "may_run_on_host": slug == HOST_DEMO_TENANT}
            )
            tenants.append(tenant)
            for email, full_name, role in people:
                user, created = User.objects.get_or_create(
                    email=email, defaults={"full_name": full_name}
                )
                if created:
                    user.set_password(password)
                    user.save()
                Membership.objects.get_or_create(tenant=tenant, user=user, defaults={"role": role})
                rows.append((email, role, slug))
        catalog = seed_catalog()
        # This host's real capacity (its CPUs, and GPUs if NVML finds any).
        capacity_sync(backend=LocalBackend())
        self.stdout.write(
            f"Catalog: {catalog['gpu_types']} GPU types, {catalog['regions']} "
            f"regions, {catalog['images']} images."
        )
        if not no_history:
            self.stdout.write(seed_demo_history(tenants).summary())
        self.stdout.write(self.style.SUCCESS("Demo data ready. Sign in with any of:"))
        for email, role, slug in rows:
            self.stdout.write(f"  {email:<24} {role:<15} tenant={slug}")
        self.stdout.write(f"  password: {password}")
