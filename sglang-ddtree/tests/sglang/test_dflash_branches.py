"""Issue 14, the DFLASH branches: every place the installed SGLang asks ``is_dflash()`` / ``is_dflash_family()``
or compares the literal name "DFLASH" is listed in SGLANG.md's table (a new release with a new branch fails here
until it is audited), and where the table says DDTREE takes a DFLASH branch it needs, SGLang's own code gives
DDTREE the same answer as DFLASH."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

SGLANG_MD = Path(__file__).resolve().parents[2] / "SGLANG.md"
KINDS = {"`is_dflash()`": "is_dflash", "`is_dflash_family()`": "is_dflash_family", '`"DFLASH"`': "DFLASH"}
#: NPU code is not audited: DDTREE refuses every --device but cuda at start-up.
SKIPPED_DIRS = ("hardware_backend/",)
#: Files worth parsing (a superset of what the AST walk records).
_CANDIDATE = re.compile(r"""\.is_dflash(?:_family)?\(|["']DFLASH["']""")


def _branches_in(tree: ast.AST, rel: str) -> set[tuple[str, str, str]]:
    found = set()

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = [*scope, child.name]
            where = ".".join(inner) or "<module>"
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr in ("is_dflash", "is_dflash_family")
            ):
                found.add((child.func.attr, rel, where))
            if isinstance(child, ast.Constant) and child.value == "DFLASH":
                found.add(("DFLASH", rel, where))
            visit(child, inner)

    visit(tree, [])
    return found


def dflash_branches(srt_root: Path) -> set[tuple[str, str, str]]:
    """(kind, path under sglang/srt, enclosing function qualname) of every ``.is_dflash()`` /
    ``.is_dflash_family()`` call and every ``"DFLASH"`` string constant."""
    found = set()
    for path in sorted(srt_root.rglob("*.py")):
        rel = path.relative_to(srt_root).as_posix()
        if rel.startswith(SKIPPED_DIRS):
            continue
        text = path.read_text(errors="replace")
        if _CANDIDATE.search(text):
            found |= _branches_in(ast.parse(text), rel)
    return found


def table_rows() -> dict[tuple[str, str, str], tuple[str, str]]:
    """SGLANG.md's DFLASH-branch table: (kind, path, function) -> (DDTREE takes it, why)."""
    rows = {}
    pattern = re.compile(r"^\| (`[^|]+`) \| `([^`]+)`: `([^`]+)` \| ([^|]+) \| ([^|]+) \| (.+) \|$")
    for line in SGLANG_MD.read_text().splitlines():
        match = pattern.match(line)
        if match and match.group(1) in KINDS:
            kind, path, function, _releases, takes, why = match.groups()
            rows[(KINDS[kind], path, function)] = (takes.strip(), why.strip())
    return rows


def _srt_root() -> Path:
    import sglang

    return Path(sglang.__file__).parent / "srt"


def test_every_dflash_branch_of_the_installed_sglang_is_in_the_sglang_md_table():
    rows = table_rows()
    assert len(rows) > 40  # the table parsed
    found = dflash_branches(_srt_root())
    assert found, "no DFLASH branch found: the scanner is broken"
    missing = sorted(found - set(rows))
    assert missing == [], (
        "SGLang branches on DFLASH in places SGLANG.md's table does not list; audit them (does DDTREE take the "
        f"branch, does it need it?) and add a row each: {missing}"
    )


def test_the_table_says_for_every_row_whether_ddtree_takes_it_and_why():
    for key, (takes, why) in table_rows().items():
        assert takes and len(why) > 10, key


def test_methods_the_table_calls_overridden_are_the_spec_classes_own(plugins_loaded):
    """Where SGLang's enum method asks is_dflash(), DDTREE must not inherit the enum's answer: the spec class
    (or CustomSpecAlgo) defines the method itself."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    from sglang_ddtree.sglang.spec_algo import DDTreeSpecAlgo

    overridden = [
        function.split(".")[-1]
        for (kind, path, function), (takes, _why) in table_rows().items()
        if path == "speculative/spec_info.py" and function.startswith("SpeculativeAlgorithm.")
        and takes.startswith("overridden")
    ]
    assert {"is_dflash_family", "handle_server_args", "create_worker", "build_disagg_draft_input"} <= set(overridden)
    for name in overridden:
        owner = next(klass for klass in DDTreeSpecAlgo.__mro__ if name in vars(klass))
        assert owner in (DDTreeSpecAlgo, CustomSpecAlgo), name
        assert getattr(DDTreeSpecAlgo, name) is not getattr(SpeculativeAlgorithm, name, None)


def test_ddtree_answers_is_dflash_like_dflash(plugins_loaded):
    """is_dflash() stays True: DDTREE's drafter is DFLASH's and SGLang sizes and places it through is_dflash()
    (see the next test); every DFLASH-only is_dflash() branch is harmless for DDTREE or unreachable (SGLANG.md)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    ddtree = SpeculativeAlgorithm.from_string("DDTREE")
    assert ddtree.is_dflash() is True and ddtree.is_dflash_family() is True


def _fake_parallel(**fields):
    base = dict(tp_size=4, attn_tp_size=2, attn_cp_size=2, attn_dp_size=1, attn_dp_enabled=False,
                enable_prefill_cp=False)
    base.update(fields)
    return SimpleNamespace(**base)


def test_drafter_parallel_layout_and_kv_width_are_dflashs(plugins_loaded, monkeypatch):
    """Through SGLang's own draft_parallel (0.5.23): under attention CP without DP DFLASH's drafter runs on the
    full TP group, and the target sizes the drafter's KV cell for that width; DDTREE gets the same answers."""
    draft_parallel = pytest.importorskip("sglang.srt.speculative.draft_parallel")
    if not hasattr(draft_parallel, "legacy_draft_attn_tp_size"):
        pytest.skip("this release has no legacy_draft_attn_tp_size")
    from sglang.srt import runtime_context
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    ddtree = SpeculativeAlgorithm.from_string("DDTREE")
    dflash = SpeculativeAlgorithm.DFLASH
    parallel = _fake_parallel()
    monkeypatch.setattr(draft_parallel, "get_parallel", lambda: parallel)
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: parallel)
    assert draft_parallel.legacy_draft_attn_tp_size(dflash) == 4  # full TP, not attention TP 2
    assert draft_parallel.legacy_draft_attn_tp_size(ddtree) == draft_parallel.legacy_draft_attn_tp_size(dflash)
    assert draft_parallel.legacy_draft_parallel_spec(ddtree) == draft_parallel.legacy_draft_parallel_spec(dflash)


def test_unified_memory_is_refused_for_ddtree_by_sglang(plugins_loaded, model_dirs):
    """The unified-memory is_dflash() branches (fused draft pools, fused HiCache draft) are unreachable for
    DDTREE: SGLang's own server-arg hook refuses --enable-unified-memory for any algorithm it does not list."""
    import argparse

    from _resolve import base_argv, resolve
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    if "--enable-unified-memory" not in parser._option_string_actions:
        pytest.skip("this release has no --enable-unified-memory")
    with pytest.raises((AssertionError, ValueError), match="unified-memory"):
        resolve([*base_argv(model_dirs, "DDTREE"), "--enable-unified-memory"])
