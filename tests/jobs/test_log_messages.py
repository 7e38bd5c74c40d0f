"""Log messages on the wire (jobs.realtime): a batch of lines is sent as one message, or as
several when its JSON would pass LOG_MESSAGE_MAX_BYTES (servers and proxies may
refuse a WebSocket message over 1 MiB), its lines in order; a line too long alone is cut to fit."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from jobs import realtime
from jobs.logs.lines import MAX_LINE_BYTES
from jobs.logs.masking import MASK
from jobs.realtime import LogLinePayload

BOUND = realtime.LOG_MESSAGE_MAX_BYTES


def payload(line_no: int, text: str) -> LogLinePayload:
    return LogLinePayload(line_no=line_no, rank=0, text=text, ts="2026-01-01T00:00:00.000+00:00")


def sent(texts: list[str]) -> list[dict]:
    return [json.loads(text) for text in texts]


def test_a_small_batch_is_one_message_encoded_as_before():
    lines = [payload(n, f"line {n}") for n in range(1, 101)]
    (text,) = realtime.encoded_log_messages(7, lines)
    assert json.loads(text) == {"type": "log", "job_id": 7, "lines": lines}


def test_sixteen_64k_lines_go_as_several_messages_under_the_bound():
    lines = [payload(n, f"{n:02d}" + "y" * (MAX_LINE_BYTES - 2)) for n in range(1, 17)]
    texts = realtime.encoded_log_messages(7, lines)
    assert len(texts) >= 3 and max(len(t.encode()) for t in texts) <= BOUND
    messages = sent(texts)
    assert {(m["type"], m["job_id"]) for m in messages} == {("log", 7)}
    assert [line for m in messages for line in m["lines"]] == lines


def test_lines_that_escaping_or_masking_make_large_fit_or_are_cut():
    # A control character is 6 bytes of JSON: a 64 KiB line of them fits on its own.
    controls = payload(1, "\x01" * MAX_LINE_BYTES)
    # A 4-character secret masked is 6 bullets, 36 bytes of JSON: 576 KiB for the line.
    masked = payload(2, MASK * (MAX_LINE_BYTES // 4))
    texts = realtime.encoded_log_messages(7, [controls, masked, payload(3, "after")])
    assert max(len(t.encode()) for t in texts) <= BOUND
    lines = [line for m in sent(texts) for line in m["lines"]]
    assert [line["line_no"] for line in lines] == [1, 2, 3]
    assert lines[0] == controls and lines[2]["text"] == "after"
    cut = lines[1]["text"]
    kept = cut.removesuffix(realtime.CUT_MARK)
    assert cut.endswith(realtime.CUT_MARK) and masked["text"].startswith(kept)
    assert len(cut) > MAX_LINE_BYTES // 2  # cut to what fits, not to nothing


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "\x01", "é", "😀", '"']), st.integers(0, 3000)),
        max_size=40,
    )
)
def test_groups_keep_every_line_in_order_within_any_bound(specs):
    max_bytes = 4096
    lines = [payload(n, char * count) for n, (char, count) in enumerate(specs, 1)]
    groups = realtime.log_line_groups(lines, max_bytes=max_bytes)
    got = [line for group in groups for line in group]
    assert [line["line_no"] for line in got] == [line["line_no"] for line in lines]
    for before, after in zip(lines, got, strict=True):
        if after["text"] != before["text"]:  # cut: a prefix and the mark
            assert after["text"].endswith(realtime.CUT_MARK)
            assert before["text"].startswith(after["text"][: -len(realtime.CUT_MARK)])
    for group in groups:
        assert group
        message = json.dumps({"type": "log", "job_id": 2**31, "lines": group})
        assert len(message.encode()) <= max_bytes
