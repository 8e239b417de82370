"""Independent reference implementations for the sglang-ddtree tests (pure Python / numpy, no shared code).

These deliberately re-derive everything from the definition in the issue instead of importing the package:
per-depth candidates sorted by (float32 log-probability desc, token id asc), scores accumulated left to right
in float64, and a best-first heap over rank tuples with ties broken by the rank tuple.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


def ddtree_device() -> torch.device:
    return torch.device(os.environ.get("SGLANG_DDTREE_TEST_DEVICE", "cpu"))


@dataclass
class RefNode:
    token: int
    depth: int
    parent: int  # node index, 0 = root
    score: float
    ranks: tuple[int, ...]


def candidates(logprobs_row: np.ndarray, k: int) -> list[list[tuple[float, int]]]:
    """Per depth: the best k (logprob, token) pairs, by logprob desc then token asc (numpy lexsort)."""
    out = []
    for row in logprobs_row:
        row = row.astype(np.float32) + np.float32(0.0)
        ids = np.arange(row.shape[0])
        order = np.lexsort((ids, -row.astype(np.float64)))[:k]
        out.append([(float(row[i]), int(i)) for i in order])
    return out


def heap_tree(logprobs_row: np.ndarray, budget: int) -> list[RefNode]:
    """The reference best-first search: pops the `budget` best rank tuples, in pop order."""
    depth_limit, vocab = logprobs_row.shape
    k = min(budget, vocab)
    cands = candidates(logprobs_row, k)
    # heap entries: (-score, ranks, parent_node, parent_score)
    heap = [(-(0.0 + cands[0][0][0]), (0,), 0, 0.0)]
    nodes: list[RefNode] = []
    while heap and len(nodes) < budget:
        _, ranks, parent, parent_score = heapq.heappop(heap)
        depth, rank = len(ranks), ranks[-1]
        score = parent_score + cands[depth - 1][rank][0]
        nodes.append(RefNode(cands[depth - 1][rank][1], depth, parent, score, ranks))
        me = len(nodes)
        if rank + 1 < k:
            heapq.heappush(
                heap, (-(parent_score + cands[depth - 1][rank + 1][0]), (*ranks[:-1], rank + 1), parent, parent_score)
            )
        if depth < depth_limit:
            heapq.heappush(heap, (-(score + cands[depth][0][0]), (*ranks, 0), me, score))
    return nodes


def all_tuples(logprobs_row: np.ndarray, budget: int) -> list[tuple[float, tuple[int, ...]]]:
    """Every rank tuple with its score (brute force, tiny sizes only)."""
    depth_limit, vocab = logprobs_row.shape
    k = min(budget, vocab)
    cands = candidates(logprobs_row, k)
    out = []
    frontier = [((), 0.0)]
    for d in range(depth_limit):
        nxt = []
        for ranks, score in frontier:
            for r in range(k):
                s = score + cands[d][r][0]
                out.append((s, (*ranks, r)))
                nxt.append(((*ranks, r), s))
        frontier = nxt
    return out


def naive_children(parents: list[int]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if p >= 0:
            children.setdefault(p, []).append(i)
    return children


def naive_walk(tokens: list[int], parents: list[int], target: list[int]) -> tuple[list[int], int]:
    """Greedy walk with a child map: (accepted node path incl. root, bonus token)."""
    kids = naive_children(parents)
    child_map = {p: {tokens[c - 1]: c for c in cs} for p, cs in kids.items()}
    path = [0]
    cur = 0
    while target[cur] in child_map.get(cur, {}):
        cur = child_map[cur][target[cur]]
        path.append(cur)
    return path, target[cur]


def chi2_sf(stat: float, dof: int) -> float:
    """Survival function of the chi-square distribution (regularised upper incomplete gamma)."""
    return float(
        torch.special.gammaincc(
            torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)
        )
    )


def chi2_test(counts: dict, probs: dict, min_expected: float = 5.0) -> float:
    """p-value of observed counts against exact probabilities; categories with small expectations are pooled.

    Returns 0.0 when an outcome of probability zero was observed.
    """
    total = sum(counts.values())
    if any(probs.get(key, 0.0) == 0.0 for key in counts):
        return 0.0  # an outcome of probability 0 was observed
    stat, dof = 0.0, -1
    pooled_obs, pooled_exp = 0.0, 0.0
    for key, p in probs.items():
        exp = p * total
        obs = counts.get(key, 0)
        if exp < min_expected:
            pooled_obs += obs
            pooled_exp += exp
            continue
        stat += (obs - exp) ** 2 / exp
        dof += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-12)
        dof += 1
    return chi2_sf(stat, max(dof, 1))


def run_interpreted(script: Path, *paths: Path) -> dict[str, dict]:
    """Run ``script`` in Triton's CPU interpreter, in a subprocess (TRITON_INTERPRET must be set before Triton is
    imported), with the package's src and ``paths`` first on PYTHONPATH; the JSON lines it prints, by ``case``."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    src = Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = os.pathsep.join([str(src), *(str(p) for p in paths), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["case"]: r for r in rows}


def run_ranks(rank_main, world: int, tmp_path, case: dict, timeout: float) -> list[dict]:
    """``rank_main(rank, world, rendezvous, out, case)`` in ``world`` spawned processes (gloo on loopback, a file
    rendezvous under ``tmp_path``); asserts every rank exited 0 and returns what each saved to ``out``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"rank{rank}.pt" for rank in range(world)]
    procs = [ctx.Process(target=rank_main, args=(rank, world, str(tmp_path / "rendezvous"), str(outs[rank]), case))
             for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0] * world, f"rank exit codes {codes} (the ranks' tracebacks are in the captured stderr)"
    return [torch.load(out) for out in outs]


@contextlib.contextmanager
def sglang_tp_group(rank: int, world: int, store: str):
    """In a rank process of :func:`run_ranks`: SGLang's distributed environment over gloo on the loopback
    interface and the TP ``GroupCoordinator`` built with the factory SGLang's ``initialize_model_parallel`` uses
    (``init_model_parallel_group(..., group_name="tp")``); the process group is destroyed on exit."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    torch.set_num_threads(1)
    import torch.distributed as dist
    from sglang.srt.distributed import parallel_state as ps

    ps.init_distributed_environment(world_size=world, rank=rank, distributed_init_method=f"file://{store}",
                                    local_rank=rank, backend="gloo")
    try:
        yield ps.init_model_parallel_group([list(range(world))], rank, "gloo", use_pynccl=False,
                                           use_custom_allreduce=False, group_name="tp")
    finally:
        dist.destroy_process_group()


def assert_ranks_build_the_full_tree(trees: list[dict], full, structure: tuple[str, ...]) -> None:
    """Every rank's tree equals rank 0's (structure and scores) and the full-vocabulary tree ``full``'s structure,
    its scores within 1e-5."""
    for rank, got in enumerate(trees):
        for field in (*structure, "scores"):
            assert torch.equal(got[field], trees[0][field]), f"rank {rank}: {field} differs from rank 0"
        for field in structure:
            assert torch.equal(got[field], getattr(full, field)), f"rank {rank}: {field} differs from the full tree"
        valid = torch.isfinite(full.scores)
        assert torch.equal(torch.isfinite(got["scores"]), valid)
        assert torch.allclose(got["scores"][valid], full.scores[valid], rtol=0, atol=1e-5)


def compile_for_sm90(kernel, types: dict[str, str], constexprs: dict[str, object], num_warps: int = 1) -> str:
    """Compile a ``@triton.jit`` kernel for sm_90 on this machine (no GPU needed) and return its PTX: what Triton's
    CPU interpreter never checks (the compiled language's typing and control flow). ``types``: a Triton type per
    runtime parameter ("*fp32", "i64", ...), parameters not named default to "i64"; ``constexprs``: the values."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(kernel.fn).parameters)
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i64") for n in names}
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(names.index(n),): v for n, v in constexprs.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm["ptx"]
