"""The delay line: holds every packet routed into a TUN device for a fixed time, then writes it back into
the same device, in order. The bed runs it inside its router namespace (``python -m
testing.netbed.delay_line --device dly0 --delay-ms 100``), since this kernel has no netem.

It creates the device, prints ``ready`` once packets can flow, and exits when its stdin closes (the test
that started it is gone) or on SIGTERM, after writing out what it still holds so nothing in flight is lost.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import fcntl
import math
import os
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
# Larger than any packet the kernel hands a TUN device without offloads (its MTU is at most 64 KiB).
READ_BYTES = 65536


def open_tun(device: str) -> int:
    """A descriptor of the TUN device ``device`` (created if missing), without packet-info headers."""
    descriptor = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(descriptor, TUNSETIFF, struct.pack("16sH", device.encode(), IFF_TUN | IFF_NO_PI))
    return descriptor


class DelayLine:
    """Packets read from ``descriptor``, each written back ``delay_s`` after it was read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, descriptor: int, delay_s: float) -> None:
        self.loop = loop
        self.descriptor = descriptor
        self.delay_s = delay_s
        # The delay is the same for every packet, so due times are in arrival order and one timer, set for
        # the oldest packet, is all it takes.
        self.held: collections.deque[tuple[float, bytes]] = collections.deque()
        self.timer: asyncio.TimerHandle | None = None

    def read(self) -> None:
        # time.monotonic(), not loop.time(): uvloop's clock is cached per loop turn in whole milliseconds,
        # which would release some packets a little early.
        due = time.monotonic() + self.delay_s
        while True:
            try:
                packet = os.read(self.descriptor, READ_BYTES)
            except BlockingIOError:
                break
            self.held.append((due, packet))
        if self.timer is None and self.held:
            self._wake_at(self.held[0][0])

    def release(self) -> None:
        self.timer = None
        now = time.monotonic()
        while self.held and self.held[0][0] <= now:
            self._write(self.held.popleft()[1])
        if self.held:
            self._wake_at(self.held[0][0])

    def _wake_at(self, due: float) -> None:
        # Whole milliseconds, rounded up: event loops time out in milliseconds, and a timer rounded down
        # to 0 would spin until the packet is due.
        wait_ms = max(1, math.ceil((due - time.monotonic()) * 1000))
        self.timer = self.loop.call_later(wait_ms / 1000, self.release)

    def release_all(self) -> None:
        while self.held:
            self._write(self.held.popleft()[1])

    def _write(self, packet: bytes) -> None:
        # A full device queue or a packet the kernel refuses: dropped, as by a congested link.
        with contextlib.suppress(OSError):
            os.write(self.descriptor, packet)


async def serve(device: str, delay_ms: float) -> None:
    """Run the delay line on ``device`` until stdin closes or SIGTERM."""
    loop = asyncio.get_running_loop()
    line = DelayLine(loop, open_tun(device), delay_ms / 1000)
    done = asyncio.Event()

    def stdin_readable() -> None:
        if not os.read(sys.stdin.fileno(), 4096):
            done.set()

    loop.add_reader(line.descriptor, line.read)
    loop.add_reader(sys.stdin.fileno(), stdin_readable)
    loop.add_signal_handler(signal.SIGTERM, done.set)
    loop.add_signal_handler(signal.SIGINT, done.set)
    print("ready", flush=True)
    await done.wait()
    loop.remove_reader(line.descriptor)
    line.release_all()
    os.close(line.descriptor)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", required=True, help="TUN device to create and serve")
    parser.add_argument("--delay-ms", type=float, required=True, help="how long each packet is held")
    options = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(options.device, options.delay_ms))
    else:
        uvloop.run(serve(options.device, options.delay_ms))


if __name__ == "__main__":
    main()
