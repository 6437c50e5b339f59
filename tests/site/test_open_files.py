"""The daemon raises its soft limit on open files to the hard limit (each peer talked to at once holds a
socket). Checked in a child process whose soft limit starts low."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

RAISE_FROM_LOW = """
import json, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
from msgbusd.site.open_files import raise_open_files_limit
in_force = raise_open_files_limit()
print(json.dumps([in_force, *resource.getrlimit(resource.RLIMIT_NOFILE)]))
"""


def test_the_soft_limit_on_open_files_is_raised_to_the_hard_one() -> None:
    done = subprocess.run([sys.executable, "-c", RAISE_FROM_LOW], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    in_force, soft, hard = json.loads(done.stdout)
    _, our_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == our_hard
    expected = hard if hard != resource.RLIM_INFINITY else 1 << 20
    assert in_force == soft == expected > 64
