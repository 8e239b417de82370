"""wait_healthy.py's reading of the new server's own log: what one start says about the DDTREE plugin."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "journal"
SPEC = importlib.util.spec_from_file_location("wait_healthy", REPO / "roles/sglang_service/files/wait_healthy.py")
wait_healthy = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(wait_healthy)

NEED, DUMMY, GRAPH, ROWS = wait_healthy.HOOK_TARGETS


def test_the_hook_targets_are_the_plugins_own():
    # the same strings the plugin registers its hooks on (sglang-ddtree/src/sglang_ddtree/sglang/hooks.py)
    hooks = (REPO / "sglang-ddtree/src/sglang_ddtree/sglang/hooks.py").read_text()
    for target in wait_healthy.HOOK_TARGETS:
        assert f'"{target}"' in hooks


def test_recorded_lab_start():
    log = wait_healthy.ddtree_log((FIXTURES / "lab-ddtree-start.txt").read_text().splitlines())
    assert log["registered"] is True
    assert log["hooks"][DUMMY] == "applied"
    assert log["hooks"][ROWS] == "not in the log"  # recorded before the plugin hooked the row headroom (12-05)
    # the plugin's warning spans two journal lines (the ImportError's message ends in a newline): read as one record
    for target in (NEED, GRAPH):
        assert log["hooks"][target].startswith("not installed: ImportError: AutoImageProcessor requires the Torch")
    assert log["worker"] is None  # the lab stand-in runs no DDTREE worker
    assert any(line.startswith("sglang-ddtree: registered speculative algorithm DDTREE") for line in log["lines"])
    assert all("\n" not in line for line in log["lines"])


def test_gpu_server_start_constructed_from_the_format_strings():
    lines = [
        "[2026-12-04 10:00:00] INFO sglang.srt.plugins: Loaded plugin ddtree from group sglang.srt.plugins",
        "INFO sglang_ddtree: sglang-ddtree: registered speculative algorithm DDTREE (sglang 0.5.23)",
        *[f"[2026-12-04 10:00:00] INFO sglang.srt.plugins.hook_registry: Applied 1 hook(s) to {t} "
          "(from: plugin=ddtree, dist=sglang-ddtree)" for t in (NEED, DUMMY, GRAPH, ROWS)],
        "[2026-12-04 10:00:09] INFO sglang_ddtree.sglang.worker: DDTREE worker: budget=16, block_size=16, glue=triton",
    ]  # fmt: skip
    log = wait_healthy.ddtree_log(lines)
    assert log["registered"] is True
    assert log["hooks"] == {NEED: "applied", DUMMY: "applied", GRAPH: "applied", ROWS: "applied"}
    assert log["worker"].endswith("DDTREE worker: budget=16, block_size=16, glue=triton")


def test_a_failed_apply_and_a_refused_registration():
    lines = [
        "sglang-ddtree: DDTREE not registered: sglang 0.5.9 is older than 0.5.17 (supported: 0.5.17 to 0.5.23)",
        f"ERROR sglang.srt.plugins.hook_registry: Failed to apply hooks to {GRAPH}",
        "Traceback (most recent call last):",
    ]
    log = wait_healthy.ddtree_log(lines)
    assert log["registered"] is False
    assert log["hooks"][GRAPH].startswith("failed:")
    assert log["hooks"][NEED] == "not in the log" and log["worker"] is None


def test_a_log_without_the_plugin():
    log = wait_healthy.ddtree_log(["INFO sglang_lab_server: The server is fired up and ready to roll!"])
    assert log == {"registered": None, "hooks": dict.fromkeys(wait_healthy.HOOK_TARGETS, "not in the log"),
                   "worker": None, "lines": []}
