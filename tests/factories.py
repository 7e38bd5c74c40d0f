from __future__ import annotations

import factory
from django.utils import timezone

from console.models import AuditEvent, Invitation, Membership, Tenant, User, sha256_hex
from console.permissions import Role

DEFAULT_PASSWORD = "correct-horse-battery-42"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("email",)
        skip_postgeneration_save = True

    email = factory.Sequence(lambda n: f"user{n}@example.test")
    full_name = factory.Faker("name")
    password = factory.PostGenerationMethodCall("set_password", DEFAULT_PASSWORD)

    @factory.post_generation
    def _save(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"Tenant {n}")
    slug = factory.Sequence(lambda n: f"tenant-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    tenant = factory.SubFactory(TenantFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.MEMBER


class InvitationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Invitation

    tenant = factory.SubFactory(TenantFactory)
    email = factory.Sequence(lambda n: f"invitee{n}@example.test")
    role = Role.MEMBER
    token_hash = factory.Sequence(lambda n: sha256_hex(f"invitation-token-{n}"))
    expires_at = factory.LazyFunction(lambda: timezone.now() + timezone.timedelta(days=7))


class AuditEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AuditEvent

    tenant = factory.SubFactory(TenantFactory)
    actor_label = "someone@example.test"
    action = "test.event"
