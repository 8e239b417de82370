"""python -m sglang_ddtree: make-tiny, generate, stats, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tqdm")
from sglang_ddtree.cli import main


@pytest.fixture(scope="module")
def cli_models(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli")
    assert main(["make-tiny", str(out), "--vocab-size", "300", "--block-size", "4", "--aligned"]) == 0
    return out


def test_make_tiny_output(cli_models, capsys):
    assert (cli_models / "target" / "tokenizer.json").is_file()
    assert (cli_models / "drafter" / "config.json").is_file()


def test_generate_check_json(cli_models, capsys):
    code = main(
        [
            "generate",
            "--target",
            str(cli_models / "target"),
            "--drafter",
            str(cli_models / "drafter"),
            "--prompt",
            "def tree",
            "--max-new-tokens",
            "16",
            "--budget",
            "6",
            "--check",
            "--json",
            "--no-stop",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["matches_greedy"] is True
    assert len(report["tokens"]) == 16
    committed = sum(int(k) * v for k, v in report["histogram"].items())
    assert report["rounds"] == sum(report["histogram"].values())
    assert committed >= len(report["tokens"]) - 1 >= committed - 4  # the last round may be cut at 16 tokens
    assert report["mean_accept_length"] > 1.5  # aligned drafter
    assert isinstance(report["text"], str)


def test_generate_text_output_and_prompt_ids(tiny_random_dirs, capsys):
    code = main(
        [
            "generate",
            "--target",
            str(tiny_random_dirs.target_dir),
            "--drafter",
            str(tiny_random_dirs.drafter_dir),
            "--prompt-ids",
            "5,6,7",
            "--max-new-tokens",
            "8",
            "--budget",
            "4",
            "--dtype",
            "float64",
            "--check",
        ]
    )
    out = capsys.readouterr()
    assert code == 0
    assert "mean acceptance length (tokens per target pass):" in out.out
    assert "matches plain greedy decoding: True" in out.out
    assert "tokens" in out.err  # the progress bar goes to stderr


def test_stats(cli_models, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["import os", "class Tree:", "the draft"]))
    code = main(
        [
            "stats",
            "--target",
            str(cli_models / "target"),
            "--drafter",
            str(cli_models / "drafter"),
            "--prompts",
            str(prompts),
            "--budgets",
            "1,8",
            "--max-new-tokens",
            "10",
            "--json",
            "--chat",
            "--dflash",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["prompts"] == 3
    assert set(report["budgets"]) == {"dflash", "1", "8"}
    # the chain verifies block_size - 1 = 3 draft tokens: at most 4 tokens per round
    assert max(int(k) for k in report["budgets"]["dflash"]["histogram"]) <= 4
    for stats in report["budgets"].values():
        assert stats["rounds"] > 0 and stats["mean_accept_length"] >= 1.0
        assert sum(stats["histogram"].values()) == stats["rounds"]


def test_stats_markdown_table(cli_models, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\n\ntwo\n")
    assert (
        main(
            [
                "stats",
                "--target",
                str(cli_models / "target"),
                "--drafter",
                str(cli_models / "drafter"),
                "--prompts",
                str(prompts),
                "--max-new-tokens",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| budget | rounds | tokens | mean acceptance length |" in out
    assert "prompts: 2" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["stats", "--target", "x", "--drafter", "y", "--prompts", "p", "--budgets", "4,0"], "--budgets '4,0'"),
        (["generate", "--target", "x", "--drafter", "y", "--prompt", "a", "--budget", "0"], "'0' is invalid"),
        (["generate", "--target", "x", "--drafter", "y", "--prompt", "a", "--temperature", "-1"], "'-1' is invalid"),
    ],
)
def test_bad_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_model_directory(tmp_path):
    with pytest.raises(SystemExit, match=r"target directory .* does not exist"):
        main(["generate", "--target", str(tmp_path / "no"), "--drafter", str(tmp_path), "--prompt-ids", "1"])


def test_module_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_ddtree", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0
    for command in ("generate", "stats", "make-tiny", "check-drafter"):
        assert command in proc.stdout


def test_check_drafter(cli_models, tmp_path, capsys):
    assert main(["check-drafter", str(cli_models / "drafter")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["consumer"] == "sglang" and report["weights_checked"]
    assert report["spec"]["block_size"] == 4
    cfg = json.loads((cli_models / "drafter" / "config.json").read_text())
    cfg["output_multiplier"] = 2.0
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["check-drafter", str(tmp_path), "--consumer", "reference"]) == 0  # the reference honours it
    capsys.readouterr()
    assert main(["check-drafter", str(tmp_path)]) == 1  # DDTREE in SGLang does not
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and "output_multiplier=2.0" in report["problems"][0]


def test_check_drafter_module_exit_status(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DFlash2DraftModel"]}))
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_ddtree", "check-drafter", str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert "DDTREE does not support DFlash2 drafters yet" in report["problems"][0]
