import pytest
from django.urls import reverse
from tests.conftest import token_client, signed_in_client

def test_probe_lockout(world, client, password):
    for i in range(6):
        r = client.post(reverse("login"), {"username": world.member.email, "password": "nope"})
        print(i, r.status_code)
    r = client.post(reverse("login"), {"username": world.member.email, "password": password})
    print("good", r.status_code, r.content[:0])

def test_probe_patch(world):
    api = token_client(world.admin, world.tenant)
    m = world.membership(world.member)
    r = api.patch(f"/api/v1/members/{m.pk}", {}, format="json")
    print(r.status_code, r.content[:300])

def test_probe_schema(client, db):
    r = client.get("/api/v1/schema/")
    print(r.status_code, r["Content-Type"], r.content[:100])
    r = client.get("/api/v1/schema/swagger/")
    print(r.status_code, r.content.decode()[:3000])

def test_probe_api_lockout(world, client):
    for i in range(6):
        r = client.post("/api/v1/auth/token", {"email": world.member.email, "password": "nope"})
        print(i, r.status_code, r.content[:200])
