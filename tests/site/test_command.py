"""``msgbusd`` on an app's install (``pip install msgbus``, without the daemon's extra): one line saying what
to install, exit status 1, no traceback. The missing packages are made missing in a child interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from msgbusd.identity.keys import new_mnemonic
from testing.local_sites import free_port

# Runs msgbusd's command in an interpreter where importing ``package`` fails as it does when it is not
# installed (ModuleNotFoundError naming it).
WITHOUT_PACKAGE = """
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == {package!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv = ["msgbusd", *{args!r}]
from msgbusd.command import main
main()
"""


def _start_args() -> list[str]:
    """Options that get the daemon as far as connecting to its Redis (where nothing listens)."""
    redis_port = free_port(2)
    redis, listen = f"redis://127.0.0.1:{redis_port}", f"127.0.0.1:{redis_port + 1}"
    return ["--twin", "1", "--redis", redis, "--listen", listen]


def _run_without(package: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    code = WITHOUT_PACKAGE.format(package=package, args=args)
    env = {**os.environ, "MSGBUS_MNEMONICS": new_mnemonic()}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)


# Imported as the command loads (starlette), once it starts (nacl: the key), or as it serves (uvicorn).
@pytest.mark.parametrize("package", ["starlette", "nacl", "uvicorn", "aiohttp"])
def test_a_missing_package_of_the_daemon_says_to_install_the_daemon_extra(package: str) -> None:
    done = _run_without(package, _start_args())
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"no module {package!r}" in lines[0]
    assert "pip install 'msgbus[daemon]'" in lines[0]
    assert done.stdout == ""


def test_a_missing_module_of_the_project_itself_is_not_taken_for_a_missing_extra() -> None:
    done = _run_without("twin_resolver", _start_args())
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert "msgbus[daemon]" not in done.stderr


def test_with_the_daemon_installed_the_command_runs_the_daemon() -> None:
    done = _run_without("no_such_package", _start_args())
    assert done.returncode == 1, done.stderr
    assert "cannot connect to Redis" in done.stderr
    assert "msgbus[daemon]" not in done.stderr


def test_the_installed_console_script_is_the_command() -> None:
    script = shutil.which("msgbusd", path=str(Path(sys.executable).parent))
    assert script is not None
    assert "msgbusd.command" in Path(script).read_text()


def test_the_daemon_starts_without_loading_what_only_some_sites_use() -> None:
    # Every start pays for what msgbusd imports: the twin sources' clients (httpx, with the rich it pulls in,
    # and the chain's websocket-client), the rules router and its rules files' YAML parser are loaded only
    # when a site uses them.
    probe = (
        "import sys, msgbusd.site.cli, msgbusd.site.daemon, msgbusd.site.companions as companions; "
        "companions.installed(); "
        "print(sorted({'httpx', 'yaml', 'rich', 'websocket', 'router.runtime'} & sys.modules.keys()))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
