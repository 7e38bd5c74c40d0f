"""SSH public keys: the parser against keys made by Debian's `ssh-keygen` and by
`cryptography` (fingerprints equal `ssh-keygen -lf`), every refusal with its words, the
service's duplicate and limit rules and audit entries, the authorized_keys lines, and the
account page and API (a person's own keys only: another's id is a 404)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from console import selectors
from console.models import AuditEvent, SshPublicKey
from console.service_errors import ErrorCode, ServiceError
from console.services import ssh_keys
from console.services.ssh_keys import ssh_key_add, ssh_key_delete
from console.ssh_public_keys import parse_public_key
from tests.concurrency import run_at_once
from tests.conftest import signed_in_client, token_client
from tests.factories import (
    MembershipFactory,
    SshPublicKeyFactory,
    UserFactory,
    ed25519_public_key_line,
)

PAGE = reverse("ssh_keys")
API = reverse("api-ssh-key-list")

SSH_KEYGEN = shutil.which("ssh-keygen")
if SSH_KEYGEN is None:  # CI installs it (.ci/run); say how, rather than skip silently
    pytest.fail(
        "ssh-keygen is missing: apt-get install -y --no-install-recommends openssh-client",
        pytrace=False,
    )


def keygen(folder: Path, key_type: str, bits: int | None = None, comment: str = "") -> Path:
    """A new key pair made by ssh-keygen; returns the private key's path (.pub beside)."""
    path = folder / f"id_{key_type}_{bits or 'default'}"
    argv = [SSH_KEYGEN, "-q", "-t", key_type, "-N", "", "-C", comment, "-f", str(path)]
    subprocess.run([*argv, *(["-b", str(bits)] if bits else [])], check=True, timeout=60)
    return path


def keygen_fingerprint(pub: Path) -> str:
    """What `ssh-keygen -lf` prints: `BITS SHA256:… COMMENT (TYPE)`; the fingerprint."""
    out = subprocess.run(
        [SSH_KEYGEN, "-lf", str(pub)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return out.split()[1]


def openssh_public(public_key) -> str:
    return public_key.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


def refusal(text: str) -> str:
    with pytest.raises(ServiceError) as caught:
        parse_public_key(text)
    assert caught.value.field == "public_key"
    assert caught.value.code is ErrorCode.INVALID
    return caught.value.message


# --- the parser ----


@pytest.mark.parametrize(
    ("key_type", "bits", "label"),
    [
        ("ed25519", None, "ED25519"),
        ("ecdsa", 256, "ECDSA 256"),
        ("ecdsa", 384, "ECDSA 384"),
        ("ecdsa", 521, "ECDSA 521"),
        ("rsa", 3072, "RSA 3072"),
        ("rsa", 4096, "RSA 4096"),
    ],
)
def test_keys_made_by_ssh_keygen_parse_with_its_fingerprint(tmp_path, key_type, bits, label):
    pub = keygen(tmp_path, key_type, bits, comment="ada@laptop work").with_suffix(".pub")
    line = pub.read_text()

    parsed = parse_public_key(line)

    assert parsed.fingerprint == keygen_fingerprint(pub)
    assert parsed.public_key == " ".join(line.split()[:2])  # type + base64, no comment
    assert parsed.comment == "ada@laptop work"
    assert parsed.label == label


@pytest.mark.parametrize(
    "make",
    [
        lambda: ed25519.Ed25519PrivateKey.generate(),
        lambda: ec.generate_private_key(ec.SECP256R1()),
        lambda: ec.generate_private_key(ec.SECP521R1()),
        lambda: rsa.generate_private_key(public_exponent=65537, key_size=3072),
    ],
    ids=["ed25519", "ecdsa-p256", "ecdsa-p521", "rsa-3072"],
)
def test_keys_made_by_cryptography_have_ssh_keygen_s_fingerprint(tmp_path, make):
    line = openssh_public(make().public_key())
    pub = tmp_path / "key.pub"
    pub.write_text(line + "\n")

    parsed = parse_public_key(f"  {line}  \n")  # surrounding blanks as pasted

    assert parsed.fingerprint == keygen_fingerprint(pub)
    assert parsed.public_key == line
    assert parsed.comment == ""


def test_a_private_key_pasted_by_mistake_is_named_as_such(tmp_path):
    private = keygen(tmp_path, "ed25519").read_text()
    assert "BEGIN OPENSSH PRIVATE KEY" in private
    message = refusal(private)
    assert "PRIVATE key" in message and "not stored" in message

    pem = rsa.generate_private_key(public_exponent=65537, key_size=3072).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    assert "PRIVATE key" in refusal(pem.decode())


# cryptography deprecates DSA SSH keys; making one here is the point (refusing it).
@pytest.mark.filterwarnings("ignore:SSH DSA key support is deprecated")
def test_weak_keys_are_refused_naming_why(tmp_path):
    rsa_2048 = keygen(tmp_path, "rsa", 2048).with_suffix(".pub").read_text()
    assert "2,048 bits" in refusal(rsa_2048) and "3,072" in refusal(rsa_2048)

    dsa_line = openssh_public(dsa.generate_private_key(key_size=1024).public_key())
    assert dsa_line.startswith("ssh-dss ")
    assert "DSA keys are no longer accepted" in refusal(dsa_line)


def test_options_certificates_and_other_formats_are_refused_with_what_to_paste(tmp_path):
    pub = keygen(tmp_path, "ed25519", comment="me@box").with_suffix(".pub")
    line = pub.read_text().strip()

    assert "Remove the options" in refusal(f'command="/bin/date",no-pty {line}')

    (tmp_path / "ca").mkdir()
    ca = keygen(tmp_path / "ca", "ed25519")
    subprocess.run(
        [SSH_KEYGEN, "-q", "-s", str(ca), "-I", "me", "-n", "me", str(pub)],
        check=True,
        timeout=60,
    )
    certificate = tmp_path / f"{pub.stem}-cert.pub"
    assert "SSH certificate" in refusal(certificate.read_text())

    rfc4716 = subprocess.run(
        [SSH_KEYGEN, "-e", "-f", str(pub)], check=True, capture_output=True, text=True
    ).stdout
    assert "ssh-keygen -i -f" in refusal(rfc4716)
    pkcs8 = subprocess.run(
        [SSH_KEYGEN, "-e", "-m", "PKCS8", "-f", str(keygen(tmp_path, "rsa", 3072))],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "PEM public key" in refusal(pkcs8)


def test_garbage_and_damaged_keys_are_refused(tmp_path):
    line = keygen(tmp_path, "ed25519").with_suffix(".pub").read_text().strip()
    key_type, data = line.split()[:2]
    other = ed25519_public_key_line()
    rsa_line = openssh_public(rsa.generate_private_key(65537, 3072).public_key())

    assert "Paste your public key" in refusal("   ")
    assert "doesn't look like an SSH public key" in refusal("hello world")
    assert "no key data" in refusal("ssh-ed25519")
    assert "not valid base64" in refusal(f"{key_type} {data[:-3]}!!!")
    assert "not a valid ssh-ed25519 key" in refusal(f"{key_type} {data[:40]}")
    # An Ed25519 key labelled as RSA: the type and the key data disagree.
    assert "not a valid ssh-rsa key" in refusal(f"ssh-rsa {data}")
    assert "one key at a time" in refusal(f"{line}\n{other}")
    assert "under 8,192" in refusal(rsa_line + " " + "x" * 9000)
    assert "FIDO" in refusal(f"sk-ssh-ed25519@openssh.com {data} me")


# --- the service ----


def test_add_stores_the_normalised_key_titled_by_its_comment_and_audits(world, tmp_path):
    pub = keygen(tmp_path, "ed25519", comment="ada@laptop").with_suffix(".pub")

    key = ssh_key_add(user=world.member, public_key=pub.read_text())

    assert key.title == "ada@laptop"
    assert key.fingerprint == keygen_fingerprint(pub)
    assert key.public_key == " ".join(pub.read_text().split()[:2])
    assert (key.key_type, key.bits, key.last_used_at) == ("ssh-ed25519", 256, None)
    event = AuditEvent.objects.get(action="ssh_key.added")
    assert (event.actor, event.tenant, event.target_id) == (world.member, None, str(key.pk))
    assert event.metadata["fingerprint"] == key.fingerprint


def test_a_title_wins_and_a_key_without_comment_gets_one(world):
    titled = ssh_key_add(user=world.member, public_key=ed25519_public_key_line("c"), title=" Work ")
    untitled = ssh_key_add(user=world.member, public_key=ed25519_public_key_line())
    assert titled.title == "Work"
    assert untitled.title == f"ED25519 key {untitled.fingerprint[7:15]}"
    with pytest.raises(ServiceError) as caught:
        ssh_key_add(user=world.member, public_key=ed25519_public_key_line(), title="t" * 101)
    assert caught.value.field == "title"


def test_the_same_key_twice_is_a_conflict_even_with_another_comment(world):
    line = ed25519_public_key_line("first")
    first = ssh_key_add(user=world.member, public_key=line)
    with pytest.raises(ServiceError) as caught:
        ssh_key_add(user=world.member, public_key=line.replace("first", "second"))
    assert caught.value.code is ErrorCode.CONFLICT
    assert first.title in caught.value.message
    # Another person may hold the same public key (it is public): one row each.
    ssh_key_add(user=world.admin, public_key=line)
    assert SshPublicKey.objects.count() == 2


def test_at_most_fifty_keys_per_person(world):
    for _ in range(ssh_keys.MAX_KEYS_PER_USER):
        SshPublicKeyFactory(user=world.member)
    with pytest.raises(ServiceError) as caught:
        ssh_key_add(user=world.member, public_key=ed25519_public_key_line())
    assert caught.value.code is ErrorCode.CONFLICT and "50 SSH keys" in caught.value.message
    assert SshPublicKey.objects.filter(user=world.member).count() == 50
    ssh_key_add(user=world.admin, public_key=ed25519_public_key_line())  # per person


@pytest.mark.django_db(transaction=True)
def test_racing_adds_keep_one_copy_and_the_limit():
    """Two requests at once (two threads, two connections): the same key is stored once,
    and the 50th place goes to one of two different keys."""
    user = UserFactory()
    line = ed25519_public_key_line("race")
    refused: list[ErrorCode] = []

    def add(public_key: str) -> None:
        try:
            ssh_key_add(user=user, public_key=public_key)
        except ServiceError as error:
            refused.append(error.code)

    run_at_once(lambda: add(line))
    assert SshPublicKey.objects.filter(user=user).count() == 1
    assert refused == [ErrorCode.CONFLICT]

    refused.clear()
    for _ in range(ssh_keys.MAX_KEYS_PER_USER - 2):
        SshPublicKeyFactory(user=user)
    lines = iter([ed25519_public_key_line("a"), ed25519_public_key_line("b")])
    run_at_once(lambda: add(next(lines)))
    assert SshPublicKey.objects.filter(user=user).count() == ssh_keys.MAX_KEYS_PER_USER
    assert refused == [ErrorCode.CONFLICT]


def test_delete_removes_the_key_and_audits(world):
    key = ssh_key_add(user=world.member, public_key=ed25519_public_key_line("x"))
    ssh_key_delete(key=key)
    assert not SshPublicKey.objects.exists()
    event = AuditEvent.objects.get(action="ssh_key.removed")
    assert (event.actor, event.metadata["fingerprint"]) == (world.member, key.fingerprint)


def test_authorized_keys_lines_of_users(world):
    ada = SshPublicKeyFactory(user=world.member)
    bob = SshPublicKeyFactory(user=world.admin)
    SshPublicKeyFactory(user=world.viewer)  # not asked for
    gone = SshPublicKeyFactory(user=UserFactory(is_active=False))

    lines = selectors.ssh_keys_for_users(users=[world.member, world.admin, gone.user])

    assert sorted(lines) == sorted(
        [
            f"{ada.public_key} {world.member.email} key-{ada.pk}",
            f"{bob.public_key} {world.admin.email} key-{bob.pk}",
        ]
    )
    for line in lines:  # each a key sshd itself reads
        assert parse_public_key(line).public_key in (ada.public_key, bob.public_key)


# --- the account page ----


def test_the_page_explains_keys_when_there_are_none_and_is_in_the_menu(world):
    client = signed_in_client(world.member, world.tenant)
    page = client.get(PAGE)
    assert page.status_code == 200
    assert b'data-testid="ssh-keys-empty"' in page.content
    assert b"dev environments" in page.content
    assert f'href="{PAGE}"'.encode() in client.get(reverse("api_tokens")).content


def test_the_page_adds_lists_and_refuses_with_form_errors(world, tmp_path):
    client = signed_in_client(world.member, world.tenant)
    pub = keygen(tmp_path, "ecdsa", 384, comment="ada@laptop").with_suffix(".pub")

    added = client.post(PAGE, {"public_key": pub.read_text(), "title": ""})
    assert added.status_code == 302
    page = client.get(PAGE).content.decode()
    assert "ada@laptop" in page and "ECDSA 384" in page and keygen_fingerprint(pub) in page

    again = client.post(PAGE, {"public_key": pub.read_text(), "title": ""})
    assert again.status_code == 400 and "You added this key already" in again.content.decode()
    private = client.post(PAGE, {"public_key": pub.with_suffix("").read_text()})
    assert private.status_code == 400 and "PRIVATE key" in private.content.decode()
    assert SshPublicKey.objects.filter(user=world.member).count() == 1


def test_the_page_adds_through_htmx_into_its_partial(world):
    client = signed_in_client(world.member, world.tenant)
    response = client.post(
        PAGE, {"public_key": ed25519_public_key_line("via-htmx")}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert 'data-testid="ssh-key-added"' in body and "<html" not in body
    assert "via-htmx" in body

    refused = client.post(PAGE, {"public_key": "nonsense"}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 200  # htmx swaps only 2xx: the form shows its error
    assert "doesn&#x27;t look like an SSH public key" in refused.content.decode()


def test_delete_asks_first_then_deletes(world):
    key = SshPublicKeyFactory(user=world.member, title="old laptop")
    client = signed_in_client(world.member, world.tenant)
    url = reverse("ssh_key_delete", args=[key.pk])

    ask = client.get(url)
    assert ask.status_code == 200 and "old laptop" in ask.content.decode()
    assert SshPublicKey.objects.filter(pk=key.pk).exists()

    done = client.post(url)
    assert done.status_code == 302 and done["Location"] == PAGE
    assert not SshPublicKey.objects.filter(pk=key.pk).exists()


def test_another_person_s_key_is_a_404_on_the_page(world, other_world):
    key = SshPublicKeyFactory(user=world.member, title="ada's")
    for user in (world.owner, other_world.owner):  # not even the owner of her organisation
        client = signed_in_client(user)
        url = reverse("ssh_key_delete", args=[key.pk])
        assert client.get(url).status_code == 404
        assert client.post(url).status_code == 404
        assert "ada's" not in client.get(PAGE).content.decode()
    assert SshPublicKey.objects.filter(pk=key.pk).exists()


def test_the_page_needs_sign_in(db):
    response = Client().get(PAGE)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


# --- the API ----


def test_api_adds_lists_and_deletes_with_a_token(world, tmp_path, django_assert_max_num_queries):
    api = token_client(world.member, world.tenant)
    pub = keygen(tmp_path, "rsa", 3072, comment="ci@runner").with_suffix(".pub")

    created = api.post(API, {"public_key": pub.read_text()}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["fingerprint"] == keygen_fingerprint(pub)
    assert (body["title"], body["type_label"], body["bits"]) == ("ci@runner", "RSA 3072", 3072)
    SshPublicKeyFactory(user=world.member)
    with django_assert_max_num_queries(6):
        listed = api.get(API)
    assert [row["id"] for row in listed.json()["results"]][-1] == body["id"]
    assert listed.json()["count"] == 2

    url = reverse("api-ssh-key-detail", args=[body["id"]])
    assert api.get(url).json()["public_key"] == " ".join(pub.read_text().split()[:2])
    assert api.delete(url).status_code == 204
    assert api.get(url).status_code == 404


def test_api_refusals_use_the_error_envelope(world, tmp_path):
    api = token_client(world.member, world.tenant)
    line = ed25519_public_key_line("x")
    assert api.post(API, {"public_key": line}, format="json").status_code == 201

    duplicate = api.post(API, {"public_key": line}, format="json")
    assert duplicate.status_code == 409
    assert duplicate.json()["code"] == "conflict" and duplicate.json()["public_key"]

    private = keygen(tmp_path, "ed25519").read_text()
    refused = api.post(API, {"public_key": private}, format="json")
    assert refused.status_code == 400
    assert "PRIVATE key" in refused.json()["detail"] and refused.json()["code"] == "invalid"
    weak = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    small = api.post(API, {"public_key": openssh_public(weak)}, format="json")
    assert small.status_code == 400 and "2,048 bits" in small.json()["detail"]
    assert api.post(API, {"public_key": 42}, format="json").status_code == 400
    assert api.post(API, {}, format="json").status_code == 400
    assert SshPublicKey.objects.count() == 1


def test_api_another_person_s_key_is_a_404(world, other_world):
    key = SshPublicKeyFactory(user=world.member)
    url = reverse("api-ssh-key-detail", args=[key.pk])
    for user, tenant in ((world.owner, world.tenant), (other_world.owner, other_world.tenant)):
        api = token_client(user, tenant)
        assert api.get(url).status_code == 404
        assert api.delete(url).status_code == 404
        assert api.get(API).json()["count"] == 0
    assert SshPublicKey.objects.filter(pk=key.pk).exists()


def test_api_keys_are_the_person_s_in_every_organisation_and_need_auth(world, other_world):
    # The member of two organisations sees the same keys with either's token.
    from_acme = token_client(world.member, world.tenant)
    created = from_acme.post(API, {"public_key": ed25519_public_key_line()}, format="json")
    MembershipFactory(tenant=other_world.tenant, user=world.member)
    from_globex = token_client(world.member, other_world.tenant)
    assert [r["id"] for r in from_globex.get(API).json()["results"]] == [created.json()["id"]]
    assert APIClient().get(API).status_code == 401
