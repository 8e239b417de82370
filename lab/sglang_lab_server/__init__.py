"""sglang_lab_server: a LAB STAND-IN for ``python -m sglang.launch_server`` on a CPU container.

The specdec.pivot lab has no GPU, so the real SGLang server cannot run there. This stand-in keeps every
part that matters to the pivot real:

* flags are parsed by SGLang's OWN server-args parser (``ServerArgs.add_cli_args``) after SGLang's own
  plugin loading (``sglang.srt.plugins.load_plugins()``), exactly like ``sglang.launch_server``;
* ``--speculative-algorithm`` is resolved through SGLang's registry (``SpeculativeAlgorithm.from_string``),
  so ``DDTREE`` works only once the sglang-ddtree plugin is installed in this interpreter, and an unknown
  algorithm makes the process exit non-zero at start with SGLang's own error;
* generations are real: greedy (or sampled) decoding of the tiny model on CPU with transformers, and
  the sglang-ddtree reference engine when the algorithm is DDTREE.

What it does NOT do: tensor parallelism, CUDA graphs, memory pools, batching across requests. ``--tp-size``
and ``--mem-fraction-static`` are parsed and reported, not acted on. Of ``/generate`` it implements ``text`` /
``input_ids`` and the sampling parameters ``max_new_tokens``, ``temperature``, ``stop_token_ids``,
``ignore_eos``, ``sampling_seed``; any other field (``stream``, ``return_logprob``, penalties, ``n``, ...) is
refused with a 400 naming it, never silently ignored.

Run: ``python -m sglang_lab_server --model-path DIR [any sglang.launch_server flag ...]``.
"""

from __future__ import annotations

__all__ = ["STAND_IN_NAME"]

STAND_IN_NAME = "sglang_lab_server (LAB STAND-IN for sglang.launch_server on CPU)"
