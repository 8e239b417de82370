"""Tables for the training-log parsers and real-file tests for tail reading and checkpoint discovery."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _training_log as tl

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "training_logs"


# --------------------------------------------------------------------------------------------- clean_line


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("step 1 | loss 2.0", "step 1 | loss 2.0"),
        ("step 1   \r", "step 1"),  # CRLF leftover
        ("\r 10%|#   | a\r 20%|##  | b", " 20%|##  | b"),  # tqdm redraws: the last segment is what shows
        ("\r 20%|##  | b\r\r   \r", " 20%|##  | b"),  # trailing empty redraws are ignored
        ("\x1b[32mtrain\x1b[0m: step 5", "train: step 5"),  # colour
        ("\x1b[2K\x1b[1Gstep 6", "step 6"),  # erase line + cursor
        ("\x1b]0;title\x07step 7", "step 7"),  # OSC window title
        ("", ""),
        ("\r\r", ""),
    ],
)
def test_clean_line(raw, expected):
    assert tl.clean_line(raw) == expected


# ------------------------------------------------------------------------------------------- parse_number


@pytest.mark.parametrize(
    ("text", "suffix", "expected"),
    [
        ("19.5", "K", 19500.0),
        ("19.5", "k", 19500.0),
        ("2.1", "M", 2_100_000.0),
        ("1", "G", 1e9),
        ("1,234", "", 1234.0),
        ("1,234.5", "", 1234.5),
        ("12", None, 12.0),
        ("4.5e-01", "", 0.45),
        ("-0.5", "", -0.5),
        (".5", "", 0.5),
        ("nan", "", None),
        ("inf", "", None),
        ("", "", None),
        (None, "", None),
        ("12", "X", None),  # unknown suffix
        ("1,23", "", None),  # not a thousands separator
        ("abc", "", None),
    ],
)
def test_parse_number(text, suffix, expected):
    assert tl.parse_number(text, suffix) == expected


# --------------------------------------------------------------------------------------- one-line regexes


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("step 5380 | 19.5K tok/s | loss 1.234", 5380),
        ("Step: 12/100", 12),
        ("global_step=77 lr=1e-4", 77),
        ("[step 9]", 9),
        ("STEP#3", 3),
        ("step_42 saved", 42),
        ("steps 5 remaining", None),  # plural is not the step counter
        ("stepping through data 5", None),
        ("footstep 5", None),
        ("no counter here", None),
    ],
)
def test_default_step_regex(line, step):
    assert tl.parse_training_log([line])["last_step"] == step


@pytest.mark.parametrize(
    ("line", "throughput"),
    [
        ("19.5K tok/s", 19500.0),
        ("19.5k tok/s", 19500.0),
        ("| 19500 tokens/s |", 19500.0),
        ("1,234 tok/sec", 1234.0),
        ("2.5M tokens/second", 2_500_000.0),
        ("1G tok / s", 1e9),
        ("tok/s: 19.5K", 19500.0),
        ("tok/s=18.1K]", 18100.0),
        ("tokens/sec=2.1M", 2_100_000.0),
        ("train_loss=0.8731 tokens/sec=2.1M", 2_100_000.0),  # a unit followed by '=' is a label
        ("step 5 tok/s: 19.5K", 19500.0),
        ("loss 1.2,19.5K tok/s", 19500.0),  # '2,19' is not a thousands-separated number
        ("12 it/s", None),
        ("tokens 1000", None),
        ("19.5K toks/sample", None),
    ],
)
def test_default_throughput_regex(line, throughput):
    assert tl.parse_training_log([line])["throughput_tok_s"] == throughput


@pytest.mark.parametrize(
    ("line", "loss", "text"),
    [
        ("loss 1.234", 1.234, "1.234"),
        ("loss=2.1e-02", 0.021, "2.1e-02"),
        ("Loss: 0.5", 0.5, "0.5"),
        ("train_loss: 0.98 val_loss: 1.5", 0.98, "0.98"),  # the first loss of a line wins
        ("loss nan", None, "nan"),
        ("loss: -inf", None, "-inf"),
        ("losses 5", None, None),
        ("lossy 5", None, None),
        ("no metric", None, None),
    ],
)
def test_default_loss_regex(line, loss, text):
    parsed = tl.parse_training_log([line])
    assert parsed["loss"] == (pytest.approx(loss) if loss is not None else None)
    assert parsed["loss_text"] == text


def test_newest_line_wins_per_metric():
    lines = [
        "step 10 | 10.0K tok/s | loss 3.0",
        "step 11 | loss 2.9",  # newest step and loss, no throughput
        "eval done",
    ]
    parsed = tl.parse_training_log(lines)
    assert parsed["last_step"] == 11
    assert parsed["line"] == "step 11 | loss 2.9"
    assert parsed["loss"] == pytest.approx(2.9)
    assert parsed["throughput_tok_s"] == 10000.0  # from the newest line that has one


def test_compiled_patterns_are_accepted():
    parsed = tl.parse_training_log(["it 7 | 3 samples"], re.compile(r"it (\d+)"), re.compile(r"(\d+) samples"))
    assert parsed["last_step"] == 7
    assert parsed["throughput_tok_s"] == 3.0


# ---------------------------------------------------------------------------------------- fixture files

HF = {
    "step_regex": r"(\d+)/\d+ \[",
    "loss_regex": r"'loss': ([\d.]+)",
    "throughput_regex": r"tokens_per_second': ([\d.]+)",
}

LOG_CASES = [
    # file, regex overrides, last_step, throughput, loss, loss_text, substring of `line`
    ("dflash_pipeline.log", {}, 5380, 19500.0, 1.234, "1.2340", "step 5380 | epoch 3"),
    ("tqdm_progress.log", {}, 410, 18100.0, 2.58, "2.58", "410/1000"),
    ("hf_trainer.log", {}, None, None, None, None, None),
    ("hf_trainer.log", HF, 200, 20480.5, 1.9876, "1.9876", "200/1000"),
    ("nan_loss.log", {}, 102, 19900.0, None, "nan", "step 102"),
    ("deepspeed.log", {}, 5000, 2_100_000.0, 0.8731, "0.8731", "step=5000"),
    ("torchtitan.log", {}, 5380, None, 1.234, "1.2340", "step:  5380"),
    ("torchtitan.log", {"throughput_regex": r"tps:\s*([\d,]+)"}, 5380, 19512.0, 1.234, "1.2340", "5380"),
    ("crlf.log", {}, 7, 1500.0, 0.45, "4.5e-01", "Step: 7"),
    ("empty.log", {}, None, None, None, None, None),
    ("no_metrics.log", {}, None, None, None, None, None),
]


@pytest.mark.parametrize(
    ("name", "regexes", "step", "throughput", "loss", "loss_text", "line_part"),
    LOG_CASES,
    ids=[f"{c[0]}{'-custom' if c[1] else ''}" for c in LOG_CASES],
)
def test_fixture_logs(name, regexes, step, throughput, loss, loss_text, line_part):
    lines = tl.read_tail(str(FIXTURES / name), lines=50)
    kwargs = dict(regexes)
    parsed = tl.parse_training_log(lines, **kwargs)
    assert parsed["last_step"] == step
    assert parsed["throughput_tok_s"] == (pytest.approx(throughput) if throughput is not None else None)
    assert parsed["loss"] == (pytest.approx(loss) if loss is not None else None)
    assert parsed["loss_text"] == loss_text
    if line_part is None:
        assert parsed["line"] is None
    else:
        assert line_part in parsed["line"]
        assert "\r" not in parsed["line"] and "\x1b" not in parsed["line"]


def test_every_fixture_is_covered():
    on_disk = {p.name for p in FIXTURES.glob("*.log")}
    assert on_disk == {case[0] for case in LOG_CASES}


# --------------------------------------------------------------------------------------------- read_tail


def test_read_tail_long_file_reads_only_the_end(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("".join(f"line {i}\n" for i in range(200_000)))  # ~2.3 MB
    assert tl.read_tail(str(path), lines=3) == ["line 199997", "line 199998", "line 199999"]
    # max_bytes bounds the read: never more than the last ~1 KiB, and the cut first line is dropped
    short = tl.read_tail(str(path), lines=1000, max_bytes=1024)
    assert short[-1] == "line 199999"
    assert len(short) < 1024 // len("line 199999\n") + 1
    assert all(re.fullmatch(r"line \d+", line) for line in short)


@pytest.mark.parametrize(
    ("content", "lines", "expected"),
    [
        (b"a\nb\nc\n", 2, ["b", "c"]),
        (b"a\nb\nc", 2, ["b", "c"]),  # no final newline
        (b"a\nb\n", 10, ["a", "b"]),
        (b"", 5, []),
        (b"\n\n", 5, ["", ""]),
        (b"x\xffy\n", 1, ["x\ufffdy"]),  # invalid UTF-8 is replaced, not an error
        (b"a\nb\n", 0, []),
    ],
)
def test_read_tail_table(tmp_path, content, lines, expected):
    path = tmp_path / "t.log"
    path.write_bytes(content)
    assert tl.read_tail(str(path), lines=lines, block=2) == expected  # tiny blocks exercise the backwards loop


def test_read_tail_missing_file_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        tl.read_tail(str(tmp_path / "missing.log"))


# ------------------------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("checkpoint-5380", 5380),
        ("/ckpt/step_200/", 200),
        ("epoch3_step200.pt", 200),
        ("global_step5000", 5000),
        ("latest", None),
        ("model.safetensors", None),
    ],
)
def test_step_from_name(name, step):
    assert tl.step_from_name(name) == step


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([], None),
        ([("a-1", 10.0)], ("a-1", 10.0)),
        ([("c-1", 10.0), ("c-2", 30.0), ("c-3", 20.0)], ("c-2", 30.0)),
        ([("c-100", 30.0), ("c-200", 30.0)], ("c-200", 30.0)),  # same mtime: the higher step
    ],
)
def test_newest_entry(entries, expected):
    assert tl.newest_entry(entries) == expected


def test_describe_checkpoint_pure():
    result = tl.describe_checkpoint("/d", [("/d/checkpoint-5", 100.0), ("/d/checkpoint-9", 200.0)], now=260.5)
    assert result == {
        "dir": "/d",
        "path": "/d/checkpoint-9",
        "name": "checkpoint-9",
        "step": 9,
        "mtime": 200.0,
        "mtime_iso": "1970-01-01T00:03:20+00:00",
        "age_s": 60.5,
        "count": 2,
    }
    empty = tl.describe_checkpoint("/d", [], now=1.0)
    assert empty["path"] is None and empty["count"] == 0


def test_find_newest_checkpoint_real_dir(tmp_path):
    for name, mtime in [("checkpoint-1000", 1000), ("checkpoint-3000", 3000), ("checkpoint-2000", 2000)]:
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (mtime, mtime))
    (tmp_path / "latest").write_text("checkpoint-3000")  # newest by mtime, but not a checkpoint
    (tmp_path / "config.json").write_text("{}")
    result = tl.find_newest_checkpoint(str(tmp_path), now=3600.0)
    assert result["name"] == "checkpoint-3000"
    assert result["step"] == 3000
    assert result["count"] == 3
    assert result["age_s"] == 600.0
    # a custom glob selects other entries
    files = tl.find_newest_checkpoint(str(tmp_path), "*.json", now=3600.0)
    assert files["name"] == "config.json"
    none = tl.find_newest_checkpoint(str(tmp_path), "step_*")
    assert none["path"] is None and none["count"] == 0


def test_find_newest_checkpoint_glob_chars_in_dir_name(tmp_path):
    odd = tmp_path / "run[1]"
    odd.mkdir()
    (odd / "ckpt-7").mkdir()
    assert tl.find_newest_checkpoint(str(odd))["name"] == "ckpt-7"


def test_find_newest_checkpoint_missing_dir_raises(tmp_path):
    with pytest.raises(OSError):
        tl.find_newest_checkpoint(str(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        tl.find_newest_checkpoint(str(tmp_path / "file"))


def test_describe_log_pure():
    parsed = tl.parse_training_log(["step 3 | loss 1.0"])
    result = tl.describe_log("/l", ["step 3 | loss 1.0"], parsed, mtime=100.0, now=101.25)
    assert result["age_s"] == 1.25
    assert result["last_step"] == 3
    assert result["tail"] == ["step 3 | loss 1.0"]
    assert tl.describe_log("/l", [], tl.parse_training_log([]), None, 5.0)["age_s"] is None
