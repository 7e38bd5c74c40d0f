"""`client.ssh_keys` and `gpugeek ssh-keys` against the real server: a key made by
ssh-keygen is added from its .pub file, listed with ssh-keygen's fingerprint, refused the
second time (409, exit code 6) and removed; another person's key id is not found."""

from __future__ import annotations

import io
import json
import shutil
import subprocess

import pytest
from gpugeek import Conflict, NotFound, SshKey, ValidationError
from gpugeek.cli import CONFLICT, NOT_FOUND, OK, main

from console.models import SshPublicKey
from tests.factories import SshPublicKeyFactory, ed25519_public_key_line

pytestmark = pytest.mark.integration


@pytest.fixture
def pub_file(tmp_path):
    ssh_keygen = shutil.which("ssh-keygen")
    assert ssh_keygen, "apt-get install -y --no-install-recommends openssh-client"
    path = tmp_path / "id_ed25519"
    subprocess.run(
        [ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", "sdk@laptop", "-f", str(path)],
        check=True,
        timeout=60,
    )
    printed = subprocess.run(
        [ssh_keygen, "-lf", f"{path}.pub"], check=True, capture_output=True, text=True
    ).stdout
    return path.with_suffix(".pub"), printed.split()[1]


def test_the_sdk_adds_lists_and_deletes_keys(gg, world, pub_file):
    pub, fingerprint = pub_file

    key = gg.ssh_keys.add_file(pub)

    assert isinstance(key, SshKey)
    assert (key.title, key.fingerprint, key.type_label) == ("sdk@laptop", fingerprint, "ED25519")
    assert [k.id for k in gg.ssh_keys.list()] == [key.id]
    assert gg.ssh_keys.get(key.id).public_key == " ".join(pub.read_text().split()[:2])
    with pytest.raises(Conflict):
        gg.ssh_keys.add(pub.read_text(), title="again")
    with pytest.raises(ValidationError) as caught:
        gg.ssh_keys.add(pub.with_suffix("").read_text())  # the private key
    assert "PRIVATE key" in str(caught.value)
    gg.ssh_keys.delete(key.id)
    assert gg.ssh_keys.list() == []
    theirs = SshPublicKeyFactory(user=world.admin)
    with pytest.raises(NotFound):
        gg.ssh_keys.delete(theirs.pk)
    assert SshPublicKey.objects.filter(pk=theirs.pk).exists()


def test_the_cli_adds_lists_and_removes_keys(gg, world, pub_file, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    pub, fingerprint = pub_file

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = run("--json", "ssh-keys", "add", str(pub), "--title", "work laptop")
    assert code == OK
    added = json.loads(out)
    assert (added["title"], added["fingerprint"]) == ("work laptop", fingerprint)

    code, out, _ = run("ssh-keys", "list")
    assert code == OK and "work laptop" in out and fingerprint in out

    code, _, err = run("ssh-keys", "add", str(pub))
    assert code == CONFLICT and "already" in err

    monkeypatch.setattr("sys.stdin", io.StringIO(ed25519_public_key_line("piped")))
    code, out, _ = run("--json", "ssh-keys", "add", "-")
    assert code == OK and json.loads(out)["title"] == "piped"

    code, out, _ = run("ssh-keys", "remove", str(added["id"]))
    assert code == OK and f"Deleted SSH key {added['id']}" in out
    code, _, _ = run("ssh-keys", "remove", str(added["id"]))
    assert code == NOT_FOUND
    assert list(SshPublicKey.objects.values_list("title", flat=True)) == ["piped"]
