"""Task files read like the checklist (issue 16, point 8): none is longer than about 150 lines, and the roles'
entry points import their parts by concern (the decisions live in modules, module_utils and filters)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TASK_FILES = sorted((ROOT / "roles").glob("*/tasks/*.yml"))
LIMIT = 155


@pytest.mark.parametrize("path", TASK_FILES, ids=[str(p.relative_to(ROOT / "roles")) for p in TASK_FILES])
def test_no_task_file_is_over_the_limit(path):
    n = len(path.read_text().splitlines())
    assert n <= LIMIT, f"{path.relative_to(ROOT)} has {n} lines: split it by concern into files it imports"


def _imports(tasks):
    for task in tasks or []:
        for key in ("ansible.builtin.import_tasks", "import_tasks"):
            if key in task:
                yield task[key]
        for part in ("block", "rescue", "always"):
            yield from _imports(task.get(part))


@pytest.mark.parametrize(
    ("entry", "parts"),
    [
        (
            "sglang_preflight/tasks/main.yml",
            [
                "unit.yml",
                "capabilities.yml",
                "drafter.yml",
                "fit.yml",
                "args.yml",
                "records.yml",
                "ddtree.yml",
                "plan.yml",
                "privileges.yml",
                "show.yml",
            ],
        ),
        ("sglang_service/tasks/main.yml", ["preflight.yml", "prepare.yml", "switch.yml"]),
        ("sglang_service/tasks/restore.yml", ["restore_find.yml", "restore_apply.yml"]),
        ("ddtree_plugin/tasks/main.yml", ["build.yml", "stage.yml", "install.yml", "install_failed.yml"]),
    ],
)
def test_entry_points_import_their_parts_in_order(entry, parts):
    tasks = yaml.safe_load((ROOT / "roles" / entry).read_text())
    assert list(_imports(tasks)) == parts
    for part in parts:
        assert (ROOT / "roles" / entry).parent.joinpath(part).is_file()
