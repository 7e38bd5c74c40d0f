"""The SSH keys page in a browser: reached from the account menu, the empty state says
what keys are for, a pasted key is added through htmx and listed with ssh-keygen's
fingerprint, a private key pasted by mistake is refused on the form, and a key is deleted
after the confirmation page."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from playwright.sync_api import expect

from console.models import SshPublicKey
from tests.e2e.test_launch_job import sign_in

pytestmark = pytest.mark.e2e


def test_add_refuse_and_delete_ssh_keys(browser_page, asgi_server, world, password, tmp_path):
    ssh_keygen = shutil.which("ssh-keygen")
    assert ssh_keygen, "apt-get install -y --no-install-recommends openssh-client"
    key = tmp_path / "id_ed25519"
    subprocess.run(
        [ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", "ada@laptop", "-f", str(key)],
        check=True,
        timeout=60,
    )
    fingerprint = subprocess.run(
        [ssh_keygen, "-lf", f"{key}.pub"], check=True, capture_output=True, text=True
    ).stdout.split()[1]
    page, base = browser_page, asgi_server.url

    sign_in(page, base, world.member.email, password)
    menu = page.locator("details.user-menu")
    menu.locator("summary").click()
    menu.get_by_role("link", name="SSH keys").click()
    expect(page).to_have_url(f"{base}/account/ssh-keys/")
    expect(page.get_by_test_id("ssh-keys-empty")).to_contain_text("dev environments")

    page.get_by_label("Public key").fill(key.read_text())  # the private key, by mistake
    page.get_by_role("button", name="Add key").click()
    expect(page.locator("#ssh-key-area")).to_contain_text("PRIVATE key")
    assert not SshPublicKey.objects.exists()

    page.get_by_label("Public key").fill(key.with_suffix(".pub").read_text())
    page.get_by_role("button", name="Add key").click()
    expect(page.get_by_test_id("ssh-key-added")).to_contain_text(fingerprint)
    row = page.get_by_test_id("ssh-key-table").locator("tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("ada@laptop")
    expect(row).to_contain_text("ED25519")

    row.get_by_role("link", name="Delete").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Delete SSH key")
    page.get_by_role("button", name="Delete key").click()
    expect(page).to_have_url(f"{base}/account/ssh-keys/")
    expect(page.get_by_test_id("ssh-keys-empty")).to_be_visible()
    assert not SshPublicKey.objects.exists()
    page.problems.assert_clean()
