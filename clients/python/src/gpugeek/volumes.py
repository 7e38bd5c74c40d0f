"""`client.volumes`: the organisation's volumes, and filling one from a URL or an
object-store prefix (a copy the console runs; `wait_for_fill` follows its progress)."""

from __future__ import annotations

import time

from gpugeek.errors import GpuGeekError
from gpugeek.http import Transport
from gpugeek.models import Volume


class Volumes:
    def __init__(self, http: Transport):
        self.http = http

    def list(self) -> list[Volume]:
        return [Volume.from_dict(row) for row in self.http.paginate("volumes")]

    def get(self, volume_id: int) -> Volume:
        return Volume.from_dict(self.http.get(f"volumes/{int(volume_id)}"))

    def create(
        self, name: str, *, size_gib: int, region: str, access: str = "single_writer"
    ) -> Volume:
        body = {"name": name, "size_gib": size_gib, "region": region, "access": access}
        return Volume.from_dict(self.http.post("volumes", body))

    def fill(self, volume_id: int, source: str, *, secret: str = "", endpoint: str = "") -> Volume:
        """Start filling the volume from an http(s):// URL or s3://bucket/prefix (`secret`
        names an organisation secret holding the credentials). A `Conflict` while another
        fill runs or a job mounts the volume read-write."""
        body = {"source": source, "secret": secret, "endpoint": endpoint}
        return Volume.from_dict(self.http.post(f"volumes/{int(volume_id)}/fill", body))

    def cancel_fill(self, volume_id: int) -> Volume:
        return Volume.from_dict(self.http.post(f"volumes/{int(volume_id)}/fill/cancel"))

    def wait_for_fill(self, volume_id: int, *, timeout: float = 3600, poll: float = 2) -> Volume:
        """The volume once its fill has ended (succeeded, failed or cancelled: see
        `volume.fill`); GpuGeekError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            volume = self.get(volume_id)
            if not volume.filling:
                return volume
            if time.monotonic() >= deadline:
                raise GpuGeekError(f"volume {volume_id} is still being filled")
            time.sleep(poll)
