"""TEST-ONLY instruments of the DDTREE worker, off unless their environment variable is set (GPU test suite:
bench/gpu/lossless.py). Nothing here runs on a production decode path: the worker reads the flags once at
import and skips every call when they are unset.

* ``SGLANG_DDTREE_TEST_ORACLE=FILE``: force acceptance deep and off the first branch. FILE (JSON) holds
  ``{"items": [{"prompt": [ids], "continuation": [ids]}], "ranks": [r_1, r_2, ...]}``: for a request whose prompt
  is listed, the drafter's distribution at depth d is replaced so that the target's own greedy continuation
  (from a no-speculation run) is the candidate of rank ``ranks[(round + request + d) % len(ranks)]`` (1 =
  first; ``round`` counts this process's decode rounds, so the pattern does not fall into step with the
  positions a run happens to visit) with junk tokens ranked above it. Unlisted requests and depths past the
  continuation keep the drafter's logits. The tree then has to be walked through non-first siblings at
  several depths for anything to be accepted, so a wrong logit at any node below a sibling shows up as a
  token that differs from no speculation.
* ``SGLANG_DDTREE_TEST_STATS=FILE``: one JSON line per decode round: batch size, whether the target verify ran
  a CUDA graph, accepted draft nodes per request, accepted nodes that are not their parent's first child.
* ``SGLANG_DDTREE_TEST_GRAPH_CHECK=1``: after every target verify that replayed a CUDA graph, run the same verify
  batch again eagerly and add the largest |graph - eager| logit difference and the number of nodes whose argmax
  differs to the stats line (needs ``SGLANG_DDTREE_TEST_STATS``).
* ``SGLANG_DDTREE_TEST_BUDGET=FILE`` (``SGLANG_DDTREE_BUDGET=auto`` only): FILE holds ``auto`` or one of the
  candidates (``chain`` or a budget); while it names one, every round verifies that candidate at its width with
  its graphs, untimed and unsampled, the auto choice's state left as it was. A benchmark then times every fixed
  budget in the same engine as auto (bench/gpu/tau.py), apart from the differences between engine starts. TP = 1
  only (each rank would read the file on its own).
* ``SGLANG_DDTREE_TEST_SKIP_HOOKS=name[,name]``: leave these plugin hooks out (``graph_get_spec_info``: the graph
  capture as before the fix of issue 13), to show that the graph check catches the defect.

These host-synchronise and loop over requests in Python: they are instruments, never features.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import torch

__all__ = [
    "ACTIVE",
    "BUDGET_FILE",
    "GRAPH_CHECK",
    "forced_budget",
    "forced_draft_logits",
    "graph_vs_eager",
    "nonfirst_accepts",
    "oracle_tokens",
    "skipped_hooks",
    "write_stats",
]

ORACLE_FILE = os.environ.get("SGLANG_DDTREE_TEST_ORACLE") or None
STATS_FILE = os.environ.get("SGLANG_DDTREE_TEST_STATS") or None
GRAPH_CHECK = bool(STATS_FILE) and os.environ.get("SGLANG_DDTREE_TEST_GRAPH_CHECK", "") not in ("", "0")
#: Any instrument on: the worker checks this one flag per round.
ACTIVE = bool(ORACLE_FILE or STATS_FILE)
BUDGET_FILE = os.environ.get("SGLANG_DDTREE_TEST_BUDGET") or None
_forced: tuple[tuple[int, int] | None, int | None] = (None, None)  # ((mtime_ns, size) of BUDGET_FILE, its candidate)

_oracle: dict[tuple[int, ...], tuple[list[int], list[int]]] | None = None
_ranks: list[int] = [1]
_round = 0


def skipped_hooks() -> set[str]:
    return {n.strip() for n in os.environ.get("SGLANG_DDTREE_TEST_SKIP_HOOKS", "").split(",") if n.strip()}


def forced_budget() -> int | None:
    """The candidate ``BUDGET_FILE`` names (0 for ``chain``), None for ``auto``, an empty or a missing file; read
    again whenever its modification time or size changes (one ``stat`` a round; a writer that rewrites it within
    the file system's timestamp granularity sets a new time itself, as bench/gpu/sglang_ddtree_run.py does)."""
    global _forced
    try:
        st = os.stat(BUDGET_FILE)
    except (FileNotFoundError, TypeError):
        return None
    key = (st.st_mtime_ns, st.st_size)
    if key != _forced[0]:
        with open(BUDGET_FILE, encoding="utf-8") as fh:
            text = fh.read().strip().lower()
        if text in ("", "auto"):
            value = None
        elif text == "chain":
            value = 0
        elif text.isdigit() and int(text) > 0:
            value = int(text)
        else:
            raise ValueError(f"SGLANG_DDTREE_TEST_BUDGET={BUDGET_FILE}: {text!r} is no candidate: write auto, chain "
                             "or a budget")
        _forced = (key, value)
    return _forced[1]


def _load_oracle() -> dict:
    global _oracle, _ranks
    if _oracle is None:
        with open(ORACLE_FILE) as fh:
            data = json.load(fh)
        _oracle = {tuple(item["prompt"]): item["continuation"] for item in data["items"]}
        _ranks = [int(r) for r in data.get("ranks", [1])] or [1]
    return _oracle


def oracle_tokens(reqs: Any, prefix_lens: torch.Tensor, root_tokens: torch.Tensor, depth: int):
    """(tokens [B, D] int64, ranks [B, D] int64): the no-speculation continuation after each request's root
    token and the rank it is forced to; -1 tokens where unknown (unlisted prompt, past the continuation, or the
    root is not the continuation's token at that position)."""
    global _round
    table = _load_oracle()
    _round += 1
    lens = prefix_lens.tolist()
    roots = root_tokens.tolist()
    bs = len(lens)
    tokens = torch.full((bs, depth), -1, dtype=torch.int64)
    ranks = torch.ones((bs, depth), dtype=torch.int64)
    for i in range(bs):
        req = reqs[i] if reqs is not None and i < len(reqs) else None
        prompt = tuple(getattr(req, "origin_input_ids", ()) or ())
        cont = table.get(prompt)
        for d in range(depth):
            ranks[i, d] = _ranks[(_round + i + d) % len(_ranks)]
        if cont is None:
            continue
        j = int(lens[i]) - len(prompt)  # index of the root token in the continuation
        if not 0 <= j < len(cont) or cont[j] != roots[i]:
            continue
        path = cont[j + 1 : j + 1 + depth]
        tokens[i, : len(path)] = torch.tensor(path, dtype=torch.int64)
    return tokens.to(root_tokens.device), ranks.to(root_tokens.device)


def forced_draft_logits(logits: torch.Tensor, tokens: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """Drafter logits [B, D, V] with the known tokens forced to their ranks.

    Where ``tokens[b, d] >= 0``: every logit -30, the token 0, the ``ranks[b, d] - 1`` junk tokens
    ``(token + 1 + k) % V`` (k = 0..) above it at ``0.1 * (ranks - 1 - k)`` (so the junk ranks 1..r-1 and the
    token rank r), and one runner-up ``(token + r) % V`` below it at -1 (so even a first-ranked token has
    probability ~0.7 and deep single chains lose to siblings: small budgets branch too). Elsewhere the drafter's
    own logits.
    """
    vocab = logits.shape[-1]
    known = tokens >= 0
    tok = tokens.clamp(min=0)
    forced = torch.full_like(logits, -30.0)
    max_junk = int(ranks.max()) - 1 if ranks.numel() else 0
    for k in range(max_junk):
        junk = (tok + 1 + k) % vocab
        value = 0.1 * (ranks - 1 - k).to(logits.dtype)
        use = ranks - 1 > k
        cur = forced.gather(-1, junk.unsqueeze(-1)).squeeze(-1)
        forced.scatter_(-1, junk.unsqueeze(-1), torch.where(use, value, cur).unsqueeze(-1))
    runner_up = (tok + ranks) % vocab
    forced.scatter_(-1, runner_up.unsqueeze(-1), torch.full_like(tok, -1, dtype=logits.dtype).unsqueeze(-1))
    forced.scatter_(-1, tok.unsqueeze(-1), torch.zeros_like(tok, dtype=logits.dtype).unsqueeze(-1))
    return torch.where(known.unsqueeze(-1), forced, logits)


def nonfirst_accepts(tree: Any, accept_index: torch.Tensor, accept_len: torch.Tensor) -> torch.Tensor:
    """Accepted draft nodes (per request, [B]) whose token is not the first-ranked child of its parent.

    ``accept_index`` [B, D+1] local node indices (0 = root), -1 padded; ``tree.ranks`` [B, N] 0-based ranks.
    A node is a non-first sibling when its parent's ``first_child`` is another node.
    """
    bsz, width = accept_index.shape
    idx = accept_index.clamp(min=0)
    parents = torch.gather(tree.parents, 1, idx)
    first = torch.gather(tree.first_child, 1, parents.clamp(min=0))
    step = torch.arange(width, device=idx.device).view(1, width)
    accepted = (step >= 1) & (step <= accept_len.view(bsz, 1)) & (accept_index > 0)
    return (accepted & (first != idx)).sum(dim=1)


def recurrent_state_snapshot(model_runner: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of a hybrid target's recurrent state (every layer's conv and SSM state tensors), taken before the
    verify: SGLang's GatedDeltaNet verify shifts the conv state in place (``causal_conv1d_update``), so an eager
    re-run must start from the state the graph verify started from. Empty for pure-attention targets."""
    cache = getattr(getattr(getattr(model_runner, "req_to_token_pool", None), "mamba_pool", None), "mamba_cache", None)
    if cache is None:
        return []
    tensors = list(getattr(cache, "conv", None) or [])
    temporal = getattr(cache, "temporal", None)
    if isinstance(temporal, torch.Tensor):
        tensors.append(temporal)
    return [(t, t.clone()) for t in tensors]


def graph_vs_eager(model_runner: Any, forward_batch: Any, graph_logits: torch.Tensor,
                   snapshot: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> tuple[float, int]:
    """Run the verify ``forward_batch`` again eagerly (the model runner's eager runner in place of its CUDA-graph
    runner) and compare its logits with the graph replay's: (max |difference|, nodes whose argmax differs).

    ``snapshot`` (``recurrent_state_snapshot`` taken before the graph verify) is restored first, so both passes
    start from the same recurrent state. The eager pass rewrites the tree nodes' KV slots and the per-node
    recurrent states with the values it computes: the same ones when graph and eager agree.
    """
    graph = graph_logits.float().clone()
    for live, saved_state in snapshot or []:
        live.copy_(saved_state)
    fb = copy.copy(forward_batch)
    fb.forward_metadata_ready = False  # plan the eager attention metadata again
    saved = model_runner.decode_cuda_graph_runner
    model_runner.decode_cuda_graph_runner = model_runner.eager_runner  # its can_run_graph() is False
    try:
        out = model_runner.forward(fb)
    finally:
        model_runner.decode_cuda_graph_runner = saved
    eager = out.logits_output.next_token_logits.float()[: graph.shape[0]]
    diff = float((eager - graph).abs().max()) if graph.numel() else 0.0
    mismatch = int((eager.argmax(-1) != graph.argmax(-1)).sum())
    return diff, mismatch


def write_stats(record: dict) -> None:
    with open(STATS_FILE, "a") as fh:
        fh.write(json.dumps(record) + "\n")
