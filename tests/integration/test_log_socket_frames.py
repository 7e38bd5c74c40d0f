"""The job page's live log over the real ASGI server and a WebSocket client: a batch of
long lines goes as several messages, each within `realtime.LOG_MESSAGE_MAX_BYTES` (some
servers and proxies refuse a message over 1 MiB; Daphne did, and its socket then
delivered nothing more), and the lines after it keep coming."""

from __future__ import annotations

import json

import pytest
import websocket

from console.crypto import encrypt_json
from jobs import realtime
from tests.conftest import signed_in_client
from tests.jobs.test_consumers import make_job, write_log
from tests.servers import wait_until

pytestmark = pytest.mark.integration

LINE = 65536  # the longest stored line (jobs.logs.lines.MAX_LINE_BYTES)
SECRET = "abcd"


class LiveLog:
    """A signed-in job socket and the log lines (by number) and message sizes it got."""

    def __init__(self, server, user, tenant, job_id: int):
        cookie = f"sessionid={signed_in_client(user, tenant).cookies['sessionid'].value}"
        self.socket = websocket.create_connection(
            f"{server.ws_url}/ws/jobs/{job_id}/", timeout=5, origin=server.url, cookie=cookie
        )
        self.lines: dict[int, str] = {}
        self.numbers: list[int] = []
        self.sizes: list[int] = []

    def until(self, line_no: int) -> None:
        def arrived() -> bool:
            try:
                raw = self.socket.recv()
            except websocket.WebSocketTimeoutException:
                return False
            message = json.loads(raw)
            if message["type"] == "log":
                self.sizes.append(len(raw.encode()))
                for line in message["lines"]:
                    self.lines[line["line_no"]] = line["text"]
                    self.numbers.append(line["line_no"])
            return line_no in self.lines

        wait_until(arrived, 60, interval=0, what=f"log line {line_no} on the socket")

    def close(self) -> None:
        self.socket.close()


def test_long_lines_go_in_messages_under_the_frame_limit_and_later_lines_follow(
    asgi_server, world, catalog
):
    job = make_job(world.tenant, secret_env_encrypted=encrypt_json({"TOKEN": SECRET}))
    write_log(job, ["first"])
    live = LiveLog(asgi_server, world.member, world.tenant, job.pk)
    live.until(1)

    # 16 lines of 64 KiB (1 MiB of text in one batch), then one that masking makes
    # 576 KiB of JSON on its own (each 4-character secret becomes 6 escaped bullets).
    long_lines = [f"{n:02d}" + "y" * (LINE - 2) for n in range(2, 18)]
    write_log(job, [*long_lines, SECRET * (LINE // len(SECRET)), "after the long ones"])
    live.until(19)
    # A socket opened now gets the log's tail (about 1 MiB of it) as its backfill, long
    # lines included.
    late = LiveLog(asgi_server, world.member, world.tenant, job.pk)
    late.until(19)
    write_log(job, [f"later {n}" for n in range(20, 120)])
    live.until(119)
    late.until(119)

    assert live.numbers == list(range(1, 120)), "a line missing or repeated"
    assert [live.lines[n] for n in range(2, 18)] == long_lines
    masked = live.lines[18]
    assert masked.endswith(realtime.CUT_MARK) and set(masked[: -len(realtime.CUT_MARK)]) == {"•"}
    assert live.lines[19] == "after the long ones" and live.lines[119] == "later 119"
    assert len(live.sizes) >= 4  # the long batch went as several messages
    first = late.numbers[0]
    assert late.numbers == list(range(first, 120)) and first < 17
    assert [late.lines[n] for n in range(first, 19)] == [*long_lines, masked][first - 2 :]
    assert max(live.sizes + late.sizes) <= realtime.LOG_MESSAGE_MAX_BYTES
    live.close()
    late.close()
    assert "PayloadExceededError" not in asgi_server.log()
