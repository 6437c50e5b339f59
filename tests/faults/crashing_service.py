"""A fault.echo service that dies (os._exit) in the middle of one chosen request, the first time it sees it.

Run as: python -m tests.faults.crashing_service REDIS_URL EXECUTIONS_FILE CRASH_AT MARKER_FILE
Every completed execution appends the payload to EXECUTIONS_FILE.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from client import Request, Service
from tests.faults.harness import CMD


def main() -> None:
    redis_url, executions_file, crash_at, marker = sys.argv[1:5]
    lock = threading.Lock()

    def echo(request: Request) -> bytes:
        if request.text() == crash_at and not Path(marker).exists():
            Path(marker).touch()
            os._exit(1)
        with lock, open(executions_file, "a") as out:
            out.write(request.text() + "\n")
        return request.data

    # One worker: the crash then interrupts only the chosen request, before its side effect. With more, a
    # request another worker had executed but not yet answered would rightly run again after the restart
    # (the service's processing list is at-least-once), and "executed once" would depend on timing.
    service = Service(redis_url, workers=1, name="crashing", poll_interval=0.2)
    service.register(CMD, echo)
    service.run()


if __name__ == "__main__":
    main()
