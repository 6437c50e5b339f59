"""A small disk for the event log's tests: a tmpfs of its own, mounted for the test (root only), and a file
that fills it."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(where: Path, size_kib: int, *, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size_kib`` KiB mounted on ``where`` (made if need be), unmounted afterwards whatever
    happened; the test is skipped, saying why, where it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is made with a small tmpfs: needs root to mount a tmpfs")
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size_kib}k,mode=755{',ro' if read_only else ''}"
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"a full disk is made with a small tmpfs, which could not be mounted: {mounted.stderr}")
    try:
        yield where
    finally:
        # A process that still holds a file there (a daemon that would not stop) cannot keep it mounted.
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(where)], check=True)


def remount(disk: Path, *, read_only: bool) -> None:
    subprocess.run(["mount", "-o", f"remount,{'ro' if read_only else 'rw'}", str(disk)], check=True)


def fill(disk: Path, *, leave_bytes: int = 0) -> Path:
    """Fill ``disk`` with one file, then free ``leave_bytes`` of it (whole pages); remove the file to free
    the disk."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as file:
        try:
            while True:
                file.write(b"\0" * 65536)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    if leave_bytes:
        os.truncate(filler, filler.stat().st_size - leave_bytes)
    return filler
