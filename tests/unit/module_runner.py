"""Run a collection module the way Ansible does (its own process, arguments as JSON), shared by the module tests."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

#: The directory holding ``ansible_collections/`` (the collection is linked there by scripts/link-collection.sh).
COLLECTIONS_ROOT = Path(importlib.util.find_spec("ansible_collections").submodule_search_locations[0]).parent


def module_name(short: str) -> str:
    return f"ansible_collections.specdec.pivot.plugins.modules.{short}"


def invoke_module(
    short: str,
    args: dict,
    env: dict,
    *,
    check_mode: bool = False,
    diff: bool = False,
    cwd: Path | None = None,
    timeout: float = 180,
    python: str | Path | None = None,
) -> dict:
    """Run ``specdec.pivot.<short>`` with ``args`` in a new Python process; return its JSON result.

    The arguments go in as Ansible sends them (``ANSIBLE_MODULE_ARGS`` on stdin, with the check/diff flags).
    Fails the test when the module prints no JSON, or when its exit status disagrees with ``failed``. ``python``:
    the interpreter that runs the module (default: this one), as ``ansible_python_interpreter`` picks it.
    """
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode, "_ansible_diff": diff}}
    proc = subprocess.run(
        [str(python or sys.executable), "-m", module_name(short)],
        input=json.dumps(payload),
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    try:
        result = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(
            f"module printed no JSON: rc={proc.returncode} {proc.stdout[-2000:]!r} {proc.stderr[-3000:]!r}"
        ) from exc
    assert (proc.returncode != 0) == bool(result.get("failed")), (proc.returncode, result, proc.stderr[-3000:])
    return result
