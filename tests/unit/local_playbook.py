"""Run a playbook with this checkout's ansible-playbook on localhost (connection local), shared by the unit tests
that drive a role's real task files without a lab: the repository's ansible.cfg, a private local temp dir, this
interpreter as the target's Python, plain-text output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def ansible_playbook() -> str:
    """This checkout's ansible-playbook (.venv: the ansible-core the pivot is run with), or another core's where
    SPECDEC_ANSIBLE_PLAYBOOK names it (scripts/test.sh runs these tests again on the oldest core runtime.yml admits)."""
    return os.environ.get("SPECDEC_ANSIBLE_PLAYBOOK") or str(REPO / ".venv" / "bin" / "ansible-playbook")


def run_local_playbook_version() -> str:
    """``ansible-playbook --version``'s first line, e.g. ``ansible-playbook [core 2.19.4]``."""
    proc = subprocess.run([ansible_playbook(), "--version"], capture_output=True, text=True, check=True, timeout=60)
    return proc.stdout.splitlines()[0]


def run_local_playbook(
    book: Path, tmp_path: Path, *args: str, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``ansible-playbook -i localhost, BOOK ARGS...`` from the repository root; ``env`` (default: this process's
    environment) gets the Ansible settings above. Never raises on a failed play: the caller reads ``returncode``."""
    env = dict(os.environ if env is None else env)
    env.update(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_STDOUT_CALLBACK="default",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_NOCOLOR="1",
    )
    return subprocess.run(
        [ansible_playbook(), "-i", "localhost,", str(book), *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env, check=False,
    )  # fmt: skip


def one_line(out: str) -> str:
    """A play's output with the YAML callback's line wrapping (which differs between ansible-core releases) and its
    doubled quotes undone, for asserting on a message."""
    return re.sub(r"\s+", " ", out).replace("''", "'")


def play(tmp_path: Path, playbook: str, extra: dict | None = None, timeout: float = 120) -> tuple[int, str]:
    """Run the playbook text with ``extra`` as extra vars (JSON): its exit status and :func:`one_line` output."""
    book = tmp_path / "book.yml"
    book.write_text(playbook)
    proc = run_local_playbook(book, tmp_path, *(["-e", json.dumps(extra)] if extra else []), timeout=timeout)
    return proc.returncode, one_line(proc.stdout + proc.stderr)
