"""Run SGLang's real server-args parse + resolution for a command line and read the resolved fields."""

from __future__ import annotations

FIELDS = (
    "speculative_algorithm",
    "speculative_num_draft_tokens",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_dflash_block_size",
    "speculative_draft_attention_backend",
    "disable_overlap_schedule",
    "attention_backend",
    "max_running_requests",
    "enable_mixed_chunk",
    "page_size",
)


def resolve(argv: list[str]) -> dict:
    from sglang.srt.server_args import prepare_server_args

    from sglang_ddtree.sglang.versions import resolved_field

    server_args = prepare_server_args(argv)  # 0.5.17 resolves here (__post_init__)
    if hasattr(server_args, "resolve_once"):  # 0.5.23 resolves on demand, as launch_server does
        server_args.resolve_once()
    return {name: resolved_field(server_args, name) for name in FIELDS}


def base_argv(model_dirs: dict, algorithm: str, drafter: str = "drafter", device: str = "cuda") -> list[str]:
    return [
        "--model-path", model_dirs["target"],
        "--speculative-algorithm", algorithm,
        "--speculative-draft-model-path", model_dirs[drafter],
        "--device", device,
        "--skip-tokenizer-init",
    ]
