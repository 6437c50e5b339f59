"""The TCP connections a process holds open, read from ``/proc`` (Linux): which hosts it is connected to on
a given port."""

from __future__ import annotations

import ipaddress
import os
from collections import Counter

# /proc/net/tcp's state of an established connection.
ESTABLISHED = "01"


def connections_to(pid: int, port: int) -> Counter[str]:
    """How many established connections process ``pid`` has to ``port``, by remote IPv4 host."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    hosts: Counter[str] = Counter()
    with open(f"/proc/{pid}/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            host_hex, port_hex = remote.split(":")
            if state == ESTABLISHED and inode in inodes and int(port_hex, 16) == port:
                hosts[str(ipaddress.IPv4Address(bytes.fromhex(host_hex)[::-1]))] += 1
    return hosts
