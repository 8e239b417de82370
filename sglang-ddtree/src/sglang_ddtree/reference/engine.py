"""Hugging Face transformers reference engine for DDTree speculative decoding (one request at a time).

A round:
1. drafter pass over one block (root token + mask tokens) conditioned on the target's hidden states of all
   committed tokens -> draft logits for depths 1..D;
2. ``build_tree`` -> the best ``budget`` nodes;
3. ONE target forward over the N+1 tree tokens at positions ``start + depth`` with a 4-D additive mask (the
   committed prefix plus the node's ancestors-or-self);
4. the walk (greedy, or the exactly lossless sampling walk for temperature > 0);
5. KV-cache compaction: keep the prefix and the accepted path's entries, in depth order;
6. the accepted nodes' target hidden states become the drafter's next context.

``mode="dflash"`` replaces step 2 by the drafter's argmax chain (D nodes, one per depth: what DFLASH verifies),
so DFLASH and DDTREE acceptance lengths come from one engine.

This is the oracle the serving plugin is compared against and a tool for offline acceptance statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..tree import DraftTree, build_tree
from ..verify import greedy_walk, sampling_walk
from .drafter import DFlashDrafter

__all__ = ["MODES", "GenerateResult", "chain_tree", "generate", "greedy_generate", "tree_attention_mask"]

#: Drafting modes of :func:`generate`: a DDTree of ``budget`` nodes, or DFLASH's argmax chain.
MODES = ("ddtree", "dflash")


@dataclass
class GenerateResult:
    """Output of :func:`generate`.

    Attributes:
        tokens: generated token ids (the prompt excluded), at most ``max_new_tokens``, ending at the first stop
            token when one was produced.
        accept_lengths: per verify round, the tokens that round committed (accepted drafts + 1 bonus); the
            first token (from the prefill) is not part of any round.
        stopped: True when a stop token ended generation.
    """

    tokens: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)
    stopped: bool = False

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0


def tree_attention_mask(ancestors: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """4-D additive mask [1, 1, N+1, prefix_len + N+1]: 0 where visible, dtype-min elsewhere.

    Args:
        ancestors: bool [N+1, N+1] ancestor-or-self relation of one tree.
    """
    nodes = ancestors.shape[0]
    visible = torch.cat([torch.ones((nodes, prefix_len), dtype=torch.bool, device=ancestors.device), ancestors], dim=1)
    mask = torch.zeros(visible.shape, dtype=dtype, device=ancestors.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


def chain_tree(draft_logits: torch.Tensor) -> DraftTree:
    """The drafter's argmax chain as a :class:`DraftTree` of N = D nodes (node d at depth d, parent d-1).

    Args:
        draft_logits: [B, D, V] drafter logits at block positions 1..D.

    Returns:
        DraftTree with tokens = argmax per depth (lowest id on ties), ranks 0, scores the cumulative float64
        sum of the tokens' float32 log-probabilities.
    """
    bsz, depth, _ = draft_logits.shape
    device = draft_logits.device
    logprobs_all = torch.log_softmax(draft_logits.float(), dim=-1)
    tokens = torch.argmax(draft_logits.float(), dim=-1)  # [B, D]
    logprobs = torch.gather(logprobs_all, 2, tokens[..., None])[..., 0]
    idx = torch.arange(depth + 1, device=device)
    parents = (idx - 1)[None].expand(bsz, -1).clone()
    first_child = torch.where(idx < depth, idx + 1, -1)[None].expand(bsz, -1).clone()
    ancestors = (idx[None, :] <= idx[:, None])[None].expand(bsz, -1, -1).clone()
    return DraftTree(
        tokens=tokens.to(torch.int64),
        depths=(idx[1:])[None].expand(bsz, -1).clone(),
        parents=parents,
        ancestors=ancestors,
        first_child=first_child,
        next_sibling=torch.full((bsz, depth + 1), -1, dtype=torch.int64, device=device),
        num_nodes=torch.full((bsz,), depth + 1, dtype=torch.int64, device=device),
        scores=torch.cumsum(logprobs.double(), dim=1),
        ranks=torch.zeros((bsz, depth), dtype=torch.int64, device=device),
        logprobs=logprobs,
        max_depth=depth,
    )


def _as_input_ids(input_ids, device) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=device)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise ValueError(f"input_ids must be one non-empty sequence ([L] or [1, L]), got shape {tuple(ids.shape)}")
    return ids


def _compact_cache(cache, keep: torch.Tensor) -> None:
    """Keep only the sequence positions ``keep`` (in that order) in every attention layer of a DynamicCache."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            if not hasattr(layer, "keys") or not torch.is_tensor(layer.keys):
                raise TypeError(
                    f"cache layer {type(layer).__name__} is not a plain attention KV cache; the reference engine "
                    "supports attention-only targets (no recurrent / linear-attention layers)"
                )
            layer.keys = layer.keys.index_select(-2, keep)
            layer.values = layer.values.index_select(-2, keep)
        return
    for i in range(len(cache.key_cache)):  # older transformers
        cache.key_cache[i] = cache.key_cache[i].index_select(-2, keep)
        cache.value_cache[i] = cache.value_cache[i].index_select(-2, keep)


def _new_cache(target):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=target.config)
    except TypeError:
        return DynamicCache()


def _sample_or_argmax(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(torch.argmax(logits, dim=-1))
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


@torch.no_grad()
def generate(
    target,
    drafter: DFlashDrafter,
    input_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    budget: int | None,
    temperature: float = 0.0,
    stop_token_ids: Sequence[int] | None = None,
    *,
    seed: int | None = None,
    on_round: Callable[[int, int], None] | None = None,
    mode: str = "ddtree",
) -> GenerateResult:
    """DDTree (or DFLASH chain) speculative decoding of one prompt with a HF causal LM target and a DFlash drafter.

    Args:
        target: a transformers causal LM with an attention-only KV cache (e.g. Qwen3ForCausalLM).
        drafter: the DFlash drafter (shares ``target``'s embeddings and lm_head).
        input_ids: the prompt, [L] or [1, L].
        max_new_tokens: maximum number of generated tokens (>= 1).
        budget: DDTree node budget N (>= 1); each verify pass has N+1 tokens. Ignored (may be None) with
            ``mode="dflash"``, whose verify pass has block_size tokens.
        temperature: 0 for greedy decoding, > 0 for exactly lossless sampling at that temperature.
        stop_token_ids: generation ends after the first of these tokens (included in the output).
        seed: seed of the sampling generator (temperature > 0).
        on_round: called after every verify round with (tokens committed this round, tokens so far).
        mode: ``"ddtree"`` (the best ``budget`` prefixes) or ``"dflash"`` (only the drafter's argmax chain, as
            DFLASH verifies it; with temperature > 0 the chain is verified by the same lossless sampling walk).

    Returns:
        GenerateResult. With temperature 0 ``tokens`` equals the target's plain greedy decoding.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} is invalid: it must be >= 1")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is invalid: expected one of {list(MODES)}")
    if mode == "ddtree" and (budget is None or budget < 1):
        raise ValueError(f"budget={budget} is invalid: the DDTree node budget must be >= 1 (e.g. 16)")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} is invalid: use 0 (greedy) or a positive value")
    if drafter.mask_token_id is None:
        raise ValueError("the drafter config has no dflash_config.mask_token_id; set it in config.json")
    device = next(target.parameters()).device
    ids = _as_input_ids(input_ids, device)
    stops = set(int(t) for t in (stop_token_ids or ()))
    generator = None
    if temperature > 0:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(0 if seed is None else int(seed))
    embed = target.get_input_embeddings()
    lm_head = target.get_output_embeddings()
    dtype = embed.weight.dtype

    cache = _new_cache(target)
    prompt_len = ids.shape[1]
    out = target(
        input_ids=ids,
        position_ids=torch.arange(prompt_len, device=device)[None],
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=True,
    )
    result = GenerateResult()
    first = _sample_or_argmax(out.logits[0, -1], temperature, generator)
    result.tokens.append(first)
    if first in stops:
        result.stopped = True
        return result
    pending_ctx = drafter.context_features(out.hidden_states)  # [1, L, k*H]
    pending_pos = torch.arange(prompt_len, device=device)[None]
    drafter_cache = drafter.new_cache()
    start = prompt_len  # position of the root (the last emitted token, not yet in the target cache)
    block = drafter.block_size

    while len(result.tokens) < max_new_tokens:
        root = result.tokens[-1]
        block_ids = torch.full((1, block), drafter.mask_token_id, dtype=torch.long, device=device)
        block_ids[0, 0] = root
        block_pos = torch.arange(start, start + block, device=device)[None]
        noise = drafter.noise_embedding(embed.weight, block_ids)
        hidden = drafter(noise, block_pos, pending_ctx, pending_pos, drafter_cache)
        draft_logits = drafter.compute_logits(hidden[:, 1:].to(dtype), lm_head)  # [1, D, V]
        tree = chain_tree(draft_logits) if mode == "dflash" else build_tree(draft_logits, budget)

        verify_ids = torch.cat([torch.tensor([[root]], device=device), tree.tokens], dim=1)
        positions = start + tree.positions
        mask = tree_attention_mask(tree.ancestors[0], start, dtype)
        out = target(
            input_ids=verify_ids,
            position_ids=positions,
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=True,
        )
        logits = out.logits  # [1, N+1, V]
        if temperature > 0:
            probs = torch.softmax(logits.double() / temperature, dim=-1)
            uniforms = torch.rand((1, tree.budget + 1), generator=generator, dtype=torch.float64).to(device)
            accept_index, accept_len, bonus = sampling_walk(tree, probs, uniforms)
        else:
            accept_index, accept_len, bonus = greedy_walk(tree, torch.argmax(logits, dim=-1))
        n_acc = int(accept_len[0])
        path = accept_index[0, : n_acc + 1]  # node indices, root first
        keep = torch.cat([torch.arange(start, device=device), start + path])
        _compact_cache(cache, keep)
        new_tokens = [*tree.tokens[0, path[1:] - 1].tolist(), int(bonus[0])]
        features = drafter.context_features(out.hidden_states)  # [1, N+1, k*H]
        pending_ctx = features[:, path]
        pending_pos = (start + torch.arange(n_acc + 1, device=device))[None]
        start += n_acc + 1
        result.accept_lengths.append(n_acc + 1)
        for tok in new_tokens:
            result.tokens.append(tok)
            if tok in stops:
                result.stopped = True
                break
            if len(result.tokens) >= max_new_tokens:
                break
        if on_round is not None:
            on_round(n_acc + 1, len(result.tokens))
        if result.stopped:
            break
    return result


@torch.no_grad()
def greedy_generate(
    target, input_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, stop_token_ids: Sequence[int] | None = None
) -> list[int]:
    """Plain greedy decoding with a KV cache (the baseline DDTree must reproduce)."""
    device = next(target.parameters()).device
    ids = _as_input_ids(input_ids, device)
    stops = set(int(t) for t in (stop_token_ids or ()))
    cache = _new_cache(target)
    out = target(input_ids=ids, past_key_values=cache, use_cache=True)
    tokens: list[int] = []
    while True:
        tok = int(torch.argmax(out.logits[0, -1]))
        tokens.append(tok)
        if tok in stops or len(tokens) >= max_new_tokens:
            return tokens
        out = target(input_ids=torch.tensor([[tok]], device=device), past_key_values=cache, use_cache=True)
