"""A synthetic systemd unit for the module tests: the unit file and the ``systemctl show`` answer for it, in the
format real systemd 252 prints (tests/unit/fixtures/systemctl_show/*.txt), replayed by the systemctl stand-in there
(``SYSTEMCTL_STANDIN_DIR``)."""

from __future__ import annotations

import os
from pathlib import Path

from module_runner import COLLECTIONS_ROOT

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "tests" / "unit" / "fixtures" / "systemctl_show" / "systemctl-stand-in"


def write_unit(tmp: Path, name: str, exec_start: str, environment: str, env_file: str | None = None) -> dict:
    """A unit file and the ``systemctl show`` answer for it; returns the module's environment."""
    units, show = tmp / "units", tmp / "show"
    units.mkdir(parents=True, exist_ok=True)
    show.mkdir(exist_ok=True)
    env_lines = "".join(f"Environment={word}\n" for word in environment.split())
    env_files = ""
    if env_file is not None:
        (tmp / "sglang.env").write_text(env_file)
        env_files = f"EnvironmentFiles={tmp / 'sglang.env'} (ignore_errors=no)\n"
        env_lines += f"EnvironmentFile={tmp / 'sglang.env'}\n"
    (units / f"{name}.service").write_text(f"[Service]\nType=simple\n{env_lines}ExecStart={exec_start}\n")
    argv = exec_start  # no quoting in these units: systemctl prints the words joined with spaces
    (show / f"{name}.txt").write_text(
        "MainPID=0\n"
        f"ExecStart={{ path={argv.split()[0]} ; argv[]={argv} ; ignore_errors=no ; start_time=[n/a] ; "
        "stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n"
        f"ExecStartEx={{ path={argv.split()[0]} ; argv[]={argv} ; flags= ; start_time=[n/a] ; "
        "stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\n"
        f"Environment={environment}\n{env_files}WorkingDirectory=\nUser=\nGroup=\nId={name}.service\n"
        f"LoadState=loaded\nActiveState=inactive\nSubState=dead\nFragmentPath=/etc/systemd/system/{name}.service\n"
        "DropInPaths=\n"
    )
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "systemctl").exists():
        (bindir / "systemctl").symlink_to(STAND_IN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "SYSTEMCTL_STANDIN", "SGLANG_"))}
    env.update(
        PATH=f"{bindir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        PYTHONPATH=str(COLLECTIONS_ROOT),
        SYSTEMCTL_STANDIN_REPO=str(REPO),
        SYSTEMCTL_STANDIN_DIR=str(show),
        SYSTEMCTL_STANDIN_UNITS=str(units),
    )
    return env
