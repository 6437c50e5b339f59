"""A handler that runs a program per request: payload on stdin, reply from stdout, errors from stderr."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable, Sequence

from client.errors import HandlerError
from client.request import Request


def exec_handler(argv: Sequence[str]) -> Callable[[Request], Awaitable[bytes]]:
    """A handler running ``argv`` (no shell) for each request.

    The payload goes to the program's stdin and its stdout is the reply. A non-zero exit replies with
    ``err`` = its stderr, stripped, or ``"exit status N"`` when stderr is empty. The program also gets the
    request's ``MSGBUS_CMD``, ``MSGBUS_SRC`` and ``MSGBUS_UID`` in its environment. Raises
    ``FileNotFoundError`` at once if the program cannot be found.
    """
    if not argv:
        raise ValueError("no program to run")
    program = shutil.which(argv[0])
    if program is None:
        raise FileNotFoundError(f"program not found: {argv[0]}")
    command = [program, *argv[1:]]

    async def run_program(request: Request) -> bytes:
        env = {
            **os.environ,
            "MSGBUS_CMD": request.cmd,
            "MSGBUS_SRC": str(request.src),
            "MSGBUS_UID": request.uid,
        }
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            stdout, stderr = await process.communicate(request.data)
        except asyncio.CancelledError:
            process.kill()
            await process.wait()
            raise
        if process.returncode != 0:
            message = stderr.decode("utf-8", errors="replace").strip()
            raise HandlerError(message or _exit_text(process.returncode))
        return stdout

    return run_program


def _exit_text(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exit status {returncode}"
