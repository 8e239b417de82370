"""bench/gpu/train_pair.py --smoke: the whole pipeline at toy size on the CPU (tokenizer, target, the target's own
continuations, DFlash drafter, reference-engine tau), and its outputs load where the GPU run's must load."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_ddtree.drafter_config import check_drafter_dir, expected_weight_shapes, resolve_drafter_config
from sglang_ddtree.reference import DFlashDrafter, generate, greedy_generate, load_models

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "train_pair.py"


def _module():
    spec = importlib.util.spec_from_file_location("train_pair", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("train_pair", module)  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("pair")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "train_log.json").read_text())


def test_losses_decrease(smoke):
    _, log = smoke
    for part in ("target", "drafter"):
        losses = [loss for _, loss in log[part]["losses"]]
        assert len(losses) >= 3
        assert losses[-1] < losses[0] - 0.5, (part, losses)
    assert log["target"]["held_out_loss"] < log["target"]["losses"][0][1]
    # the multi-anchor training forward is the reference drafter's forward
    assert log["drafter"]["train_forward_vs_reference_max_diff"] < 1e-4


def test_outputs_load_in_hf_and_the_reference_drafter(smoke):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = smoke
    target = AutoModelForCausalLM.from_pretrained(str(out / "target"), local_files_only=True)
    assert type(target).__name__ == "Qwen3ForCausalLM" and target.dtype == torch.bfloat16
    cfg = json.loads((out / "target" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["num_hidden_layers"] == 4
    tok = AutoTokenizer.from_pretrained(str(out / "target"), local_files_only=True)
    assert tok.eos_token_id == 0 and tok.convert_tokens_to_ids("<|MASK|>") == 4 and len(tok) == 400

    dcfg = json.loads((out / "drafter" / "config.json").read_text())
    assert dcfg["architectures"] == ["DFlashDraftModel"] and dcfg["model_type"] == "qwen3"
    assert set(dcfg["dflash_config"]) == {"block_size", "target_layer_ids", "mask_token", "mask_token_id"}
    assert dcfg["dflash_config"]["target_layer_ids"] == [1, 2] and dcfg["dflash_config"]["block_size"] == 8
    from safetensors import safe_open

    with safe_open(str(out / "drafter" / "model.safetensors"), framework="pt") as fh:
        names = set(fh.keys())
    assert names == set(expected_weight_shapes(resolve_drafter_config(dcfg)))  # no embed, no lm_head
    report = check_drafter_dir(out / "drafter", "sglang")
    assert report["ok"], report["problems"]
    drafter = DFlashDrafter.from_pretrained(out / "drafter", dtype=torch.float32)
    assert drafter.block_size == 8 and drafter.target_layer_ids == [1, 2]


def test_trained_pair_is_lossless_and_accepts(smoke):
    out, log = smoke
    target, drafter = load_models(out / "target", out / "drafter", dtype=torch.float32)
    prompts = json.loads((out / "eval_prompts.json").read_text())
    assert len(prompts) == 2
    for p in prompts:
        want = greedy_generate(target, p["ids"], 16)
        assert generate(target, drafter, p["ids"], 16, None, mode="dflash").tokens == want
        assert generate(target, drafter, p["ids"], 16, 8).tokens == want
    rows = {(r["temperature"], r["mode"], r["budget"]): r for r in log["eval"]["rows"]}
    assert set(rows) == {(t, m, b) for t in (0.0, 1.0) for m, b in (("dflash", None), ("ddtree", 4), ("ddtree", 8))}
    for key, row in rows.items():
        assert 1.0 <= row["tau"] <= 8.0, key
        assert sum(row["histogram"].values()) == row["rounds"] == sum(row["rounds_per_prompt"])
        assert len(row["rounds_per_prompt"]) == len(prompts)
        if key[0] == 0.0:
            assert row["prompts_differing_from_greedy"] == 0
    assert rows[(0.0, "dflash", None)]["tau"] > 1.5  # the drafter learnt the target's continuations
    zlab = log["eval"]["zlab_chain_greedy"]
    assert "tau" in zlab, zlab  # z-lab's dflash_generate ran on the same files


def test_the_reference_chain_in_the_serving_dtype_counts_rounds_per_prompt(smoke):
    """The bf16 chain row (run by the GPU evaluation beside the fp32 rows): tau_emitted over its own rounds, and
    greedy outputs compared with the fp32 target's."""
    out, _ = smoke
    module = _module()
    settings = module.smoke_settings(module.Settings())
    prompts = json.loads((out / "eval_prompts.json").read_text())
    target, _ = load_models(out / "target", out / "drafter", dtype=torch.float32)
    fp32 = {j: greedy_generate(target, p["ids"], settings.eval_new_tokens) for j, p in enumerate(prompts)}
    row = module._chain_in_serving_dtype(out, prompts, settings, torch.device("cpu"), fp32)
    assert row["dtype"] == "bfloat16" and len(row["rounds_per_prompt"]) == len(prompts)
    assert row["rounds"] == sum(row["rounds_per_prompt"]) > 0
    emitted = len(prompts) * (settings.eval_new_tokens - 1)
    assert row["tau_emitted"] == pytest.approx(emitted / row["rounds"], abs=1e-4)
    assert 0 <= row["prompts_differing_from_fp32_greedy"] <= len(prompts)
    # against outputs that are all wrong, every prompt differs: the comparison is real
    wrong = {j: [-1] for j in fp32}
    assert module._chain_in_serving_dtype(out, prompts, settings, torch.device("cpu"), wrong)[
        "prompts_differing_from_fp32_greedy"] == len(prompts)


def test_held_out_files_are_whole_and_disjoint(smoke):
    out, log = smoke
    module = _module()
    prompts = json.loads((out / "eval_prompts.json").read_text())
    held = set(log["corpus"]["held_out_names"])
    permille = log["settings"]["eval_permille"]
    for p in prompts:
        assert p["file"] in held and module.is_held_out(p["file"], permille)
    assert all(module.is_held_out(name, permille) for name in held)
    assert log["corpus"]["train_files"] > 0 and not any("/test/" in f"/{n}" for n in held)


def test_stdlib_files_skip_tests_and_site_packages(tmp_path):
    module = _module()
    for rel in ("a.py", "pkg/b.py", "test/c.py", "pkg/tests/d.py", "idlelib/idle_test/e.py", "site-packages/x/f.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    assert [str(p.relative_to(tmp_path)) for p in module.stdlib_files(tmp_path)] == ["a.py", "pkg/b.py"]


def test_anchor_batch_and_visibility():
    module = _module()
    seqs = torch.arange(40)[None].repeat(2, 1)
    gen = torch.Generator().manual_seed(0)
    anchor, block_ids, pos, labels = module.anchor_batch(seqs, 10, 4, 5, 99, gen)
    assert anchor.shape == (2, 5) and bool((anchor >= 9).all()) and bool((anchor <= 36).all())
    assert torch.equal(block_ids.view(2, 5, 4)[:, :, 0], anchor) and bool(
        (block_ids.view(2, 5, 4)[:, :, 1:] == 99).all()
    )
    assert torch.equal(labels, pos.view(2, 5, 4)[:, :, 1:])  # seqs[i] == i
    vis = module.train_visibility(anchor, 40, 4)
    assert vis.shape == (2, 1, 20, 60)
    a0 = int(anchor[0, 0])
    assert vis[0, 0, 0, :40].sum() == a0 and not vis[0, 0, 0, a0]  # context strictly before the anchor
    assert vis[0, 0, 0, 40:44].all() and not vis[0, 0, 0, 44:].any()  # its own block only
    assert module.lr_at(0, 100, 1.0, 0.1) == pytest.approx(0.1) and module.lr_at(99, 100, 1.0, 0.1) > 0.1


def test_corpus_adds_site_packages_once_and_refuses_unknown_sources(tmp_path, monkeypatch):
    """``corpus_sources=stdlib,site``: a site-packages folder on sys.path joins the corpus; a file whose text is
    already in (a vendored stdlib copy) is read once, so held-out text is never also trained on."""
    tp = _module()
    site = tmp_path / "site-packages"
    (site / "pkg" / "tests").mkdir(parents=True)
    stdlib = Path(tp.sysconfig.get_paths()["stdlib"])
    (site / "pkg" / "vendored_heapq.py").write_text((stdlib / "heapq.py").read_text())
    (site / "pkg" / "own.py").write_text("def only_here():\n    return 'site corpus'\n")
    (site / "pkg" / "tests" / "test_x.py").write_text("assert 'never in the corpus'\n")
    target = tmp_path / "site"  # a pip --target folder (the GPU host's /tmp/site): known by its dist-info
    (target / "tpkg-1.0.dist-info").mkdir(parents=True)
    (target / "tpkg.py").write_text("TARGET_FOLDER = 'pip --target corpus'\n")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "loose.py").write_text("LOOSE = 'not an install folder'\n")
    own_path = [p for p in sys.path if not p.endswith(("site-packages", "dist-packages"))]  # only these folders
    monkeypatch.setattr(sys, "path", [*own_path, str(site), str(target), str(tmp_path / "plain")])
    settings = tp.Settings(max_corpus_bytes=0, corpus_sources="stdlib,site")
    train, held, stats = tp.load_corpus(settings)
    texts = [t for _, t in train + held]
    assert str(site.resolve()) in stats["roots"]
    assert any("site corpus" in t for t in texts)
    assert any("pip --target corpus" in t for t in texts)
    assert not any("not an install folder" in t for t in texts)
    assert not any("never in the corpus" in t for t in texts)
    assert len(texts) == len(set(texts))  # heapq once, from the stdlib
    names = [n for n, _ in train + held]
    assert "heapq.py" in names and not any(n.endswith("vendored_heapq.py") for n in names)
    with pytest.raises(SystemExit, match="corpus_sources"):
        tp.load_corpus(tp.Settings(corpus_sources="stdlib,internet"))


def test_the_target_kept_is_the_best_held_out_one(smoke):
    _, log = smoke
    curve = log["target"]["held_out_curve_64_rows"]
    best_step = min(curve, key=lambda row: row[1])[0]
    assert log["target"]["kept_step"] == best_step
