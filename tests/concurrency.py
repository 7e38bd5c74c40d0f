"""Running one piece of code from several threads at once, as racing workers would."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connection


def run_at_once(action: Callable[[], object], *, copies: int = 2, timeout: float = 60) -> None:
    """Run `action` in `copies` threads released together (each thread has its own
    database connection, closed when it ends); re-raise the first error any raised."""
    barrier = threading.Barrier(copies)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=10)
            action()
        except BaseException as error:  # re-raised below, in the test's thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(copies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads), "a racing thread never finished"
    if errors:
        raise errors[0]
