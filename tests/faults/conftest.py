"""The fault-injection tests' counts, repeated at the end of the session's report so that
CI's log shows them (their own `print` is seen only with `-s`)."""

from __future__ import annotations

from tests.faults.helpers import REPORTED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if REPORTED:
        terminalreporter.section("fault-injection counts")
        for line in REPORTED:
            terminalreporter.write_line(line)
