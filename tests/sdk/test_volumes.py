"""`client.volumes` against the real server: create, list, get, and a fill refused for
an address in the console's own network (SSRF), with its error as the SDK raises it."""

from __future__ import annotations

import pytest
from gpugeek.errors import Conflict, ValidationError
from gpugeek.models import Volume

pytestmark = pytest.mark.integration


def test_volumes_are_created_listed_and_a_private_fill_is_refused(gg):
    volume = gg.volumes.create("datasets", size_gib=2, region="local")
    assert isinstance(volume, Volume) and volume.fill is None and not volume.filling
    assert [v.name for v in gg.volumes.list()] == ["datasets"]
    assert gg.volumes.get(volume.id).size_gib == 2
    with pytest.raises(ValidationError) as refused:
        gg.volumes.fill(volume.id, "http://127.0.0.1:9/data.tar")
    assert "private" in str(refused.value)
    with pytest.raises(Conflict):
        gg.volumes.cancel_fill(volume.id)
    assert gg.volumes.wait_for_fill(volume.id, timeout=1).fill is None
