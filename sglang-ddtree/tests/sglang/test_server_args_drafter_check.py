"""DDTREE start-up refuses drafter checkpoints it cannot serve exactly (sglang_ddtree.drafter_config, consumer
"sglang"), through SGLang's real server-args parse + resolution, with a message naming the field."""

from __future__ import annotations

import json

import pytest
from _resolve import base_argv, resolve
from conftest import drafter_config


@pytest.fixture(autouse=True)
def _plugin(plugins_loaded):
    return plugins_loaded


def _with_drafter(model_dirs, tmp_path, **changes) -> list[str]:
    cfg = drafter_config(8)
    dflash = changes.pop("dflash_config", None)
    cfg.update(changes)
    if dflash is not None:
        cfg["dflash_config"].update(dflash)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    argv = base_argv(model_dirs, "DDTREE")
    argv[argv.index(model_dirs["drafter"])] = str(tmp_path)
    return argv


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(architectures=["DFlash2DraftModel"]), r"DDTREE does not support DFlash2 drafters yet"),
        (dict(dflash_config={"selector_top_k": 16}), r"selector_top_k=16 marks a DFlash2 drafter"),
        (dict(output_multiplier=0.5), r"output_multiplier=0.5: DDTREE in SGLang does not apply it"),
        (dict(final_logit_softcapping=30.0), r"final_logit_softcapping=30.0"),
        (dict(is_causal=True), r"causal drafter attention is not verified"),
        (
            dict(num_target_layers=None, dflash_config={"target_layer_ids": None}),
            r"neither dflash_config.target_layer_ids nor num_target_layers",
        ),
    ],
)
def test_unservable_drafters_fail_at_startup(model_dirs, tmp_path, changes, message):
    with pytest.raises(ValueError, match=message) as info:
        resolve(_with_drafter(model_dirs, tmp_path, **changes))
    assert str(tmp_path) in str(info.value)


def test_plain_drafter_still_resolves(model_dirs, tmp_path):
    got = resolve(_with_drafter(model_dirs, tmp_path))
    assert got["speculative_algorithm"] == "DDTREE" and got["speculative_dflash_block_size"] == 8


@pytest.mark.parametrize(
    ("error", "raised"),
    [(OSError("config.json: no such file"), "DDTreeConfigError"), (ImportError("no torchvision"), "ImportError")],
)
def test_an_environment_that_cannot_read_configs_is_not_called_a_bad_drafter(monkeypatch, error, raised):
    """A drafter config SGLang's reader fails on is refused naming the flag; an ImportError is this environment's
    (a partial SGLang: the pivot's preflight then reports the check as not decided), so it propagates as itself."""
    from types import SimpleNamespace

    from sglang_ddtree.sglang import server_args

    def fails(cfg):
        raise error

    monkeypatch.setattr(server_args, "_load_draft_hf_config", fails)
    with pytest.raises(Exception) as caught:
        server_args.read_drafter_info(SimpleNamespace(speculative_draft_model_path="/models/drafter"))
    assert type(caught.value).__name__ == raised
    if raised == "DDTreeConfigError":
        assert "--speculative-draft-model-path='/models/drafter': cannot read the drafter's config" in str(caught.value)
