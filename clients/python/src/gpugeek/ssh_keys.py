"""`client.ssh_keys`: the caller's SSH public keys (for dev environments), listed, added
and deleted. They belong to the person, not to the token's organisation."""

from __future__ import annotations

from pathlib import Path

from gpugeek.http import Transport
from gpugeek.models import SshKey


class SshKeys:
    def __init__(self, http: Transport):
        self.http = http

    def list(self) -> list[SshKey]:
        return [SshKey.from_dict(row) for row in self.http.paginate("ssh-keys")]

    def get(self, key_id: int) -> SshKey:
        return SshKey.from_dict(self.http.get(f"ssh-keys/{int(key_id)}"))

    def add(self, public_key: str, *, title: str = "") -> SshKey:
        """Add a key given as its one line (`ssh-ed25519 AAAA… you@laptop`). The server
        validates it; a second add of the same key is a `Conflict`. Not retried blindly:
        a lost answer shows up as that Conflict, and the key is then in `list()`."""
        return SshKey.from_dict(
            self.http.post("ssh-keys", {"public_key": public_key, "title": title})
        )

    def add_file(self, path: str | Path, *, title: str = "") -> SshKey:
        """Add the key in a .pub file (e.g. ~/.ssh/id_ed25519.pub)."""
        return self.add(Path(path).expanduser().read_text(), title=title)

    def delete(self, key_id: int) -> None:
        self.http.request("DELETE", f"ssh-keys/{int(key_id)}")
