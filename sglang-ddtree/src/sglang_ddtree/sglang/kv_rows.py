"""How wide each request's row of SGLang's ``req_to_token`` table must be under DDTREE.

``req_to_token`` ([max requests, row width], int32) maps a request's token positions to KV slots. SGLang sizes
its rows as the context length plus ``get_req_to_token_extra_context_len()``: 4 + num_draft_tokens at page size 1
(0.5.17-0.5.23). DFLASH's decode (``DFlashDraftInputV2.prepare_for_decode``, which DDTREE runs) reserves
``committed + 2 * num_draft_tokens`` positions ahead of every running request: the in-flight step's verify and
the next one's (overlap scheduling). A request still running has ``committed <= context_len - 1``, so its
reservation can end at ``context_len - 1 + 2 * W`` (W = num_draft_tokens), past a row of ``context_len + 4 + W``
for any W > 5. Such a row write does not fail: the allocator's slots land in the next request's row (its first
positions then point at another request's KV), and the part past the row is never freed (seen on an H100,
12-05: a request ending at the 1024-token context limit left 9 slots allocated, and SGLang's idle check
stopped the scheduler with "pool memory leak detected").

DDTREE therefore widens the rows to :func:`required_row_headroom` (a hook on
``allocation_sizing.get_req_to_token_extra_context_len``, ``hooks.py``), and its worker refuses to serve on rows
narrower than that (:func:`row_width_problem`), whatever built them. SGLang's own DFLASH has the same reservation
and the same rows at page size 1; the plugin leaves it as it is (it acts for DDTREE only).
"""

from __future__ import annotations

__all__ = ["SGLANG_ROW_SLACK", "required_row_headroom", "row_width_problem"]

#: The slack SGLang adds to every row beyond the speculative reservation (its ``4 +``).
SGLANG_ROW_SLACK = 4


def required_row_headroom(num_draft_tokens: int) -> int:
    """Columns a ``req_to_token`` row needs beyond the context length: two verify widths (the overlap
    scheduler's reservation, see the module docstring) plus SGLang's slack."""
    width = int(num_draft_tokens)
    if width < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
    return 2 * width + SGLANG_ROW_SLACK


def row_width_problem(row_width: int, context_len: int, num_draft_tokens: int) -> str | None:
    """Why rows of ``row_width`` slots cannot hold DDTREE's reservation at ``context_len``, or None when they can.

    The reservation of a running request ends at most at ``context_len - 1 + 2 * num_draft_tokens`` (exclusive)."""
    furthest = int(context_len) - 1 + 2 * int(num_draft_tokens)
    if int(row_width) >= furthest:
        return None
    return (
        f"the request-to-token rows hold {row_width} positions, and a request near the context length "
        f"{context_len} reserves up to position {furthest} (2 x --speculative-num-draft-tokens {num_draft_tokens} "
        f"ahead of its last committed token): the rest would be written into the next request's row"
    )
