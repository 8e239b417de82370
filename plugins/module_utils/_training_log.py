# Private module_utils for specdec.pivot: training-log tail parsing and checkpoint discovery.
"""Read the end of a training log and the newest checkpoint of a training run.

Everything that interprets text is a pure function (text in, data out) so it is tested with tables:
:func:`clean_line`, :func:`parse_number`, :func:`parse_training_log`, :func:`step_from_name`,
:func:`newest_entry`. The only I/O is :func:`read_tail` (reads the last lines of a file without reading
the whole file) and :func:`find_newest_checkpoint` (one ``glob`` and ``stat`` per entry).
"""

from __future__ import annotations

import datetime
import errno
import glob
import os
import re
import stat
import time

# ``step 5380``, ``Step: 5380/10000``, ``global_step=5380``, ``[step 5380]``; not ``steps 5`` or ``stepping``.
DEFAULT_STEP_REGEX = r"(?i)(?<![a-z])step(?![a-z])[\s:=#_]*(\d+)"
# ``19.5K tok/s``, ``19500 tokens/s``, ``1,234 tok/sec``, ``tok/s: 19.5K``, ``tokens/s=2.1M``.
# The value is the first group that holds a number, its unit suffix (K/M/G, optional) the group after it. A unit
# followed by ``=`` or ``:`` is a label (``0.87 tokens/sec=2.1M`` is 2.1M, not 0.87).
DEFAULT_THROUGHPUT_REGEX = (
    r"(?i)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)\s*([kmg]?)\s*tok(?:en)?s?\s*/\s*s(?:ec(?:ond)?)?(?![a-z])(?!\s*[:=])"
    r"|tok(?:en)?s?\s*/\s*s(?:ec(?:ond)?)?(?![a-z])\s*[:=]?\s*(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)\s*([kmg]?)"
)
# ``loss 1.234``, ``loss=2.1e-02``, ``train_loss: 0.98``, ``loss nan``; the first loss of a line wins.
DEFAULT_LOSS_REGEX = r"(?i)(?<![a-z])loss(?![a-z])[\s:=]*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?|nan|[-+]?inf)"

DEFAULT_CHECKPOINT_GLOB = "*[0-9]*"

SUFFIX_MULTIPLIERS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_NUMBER_RE = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?$")


def clean_line(raw: str) -> str:
    """Return what a terminal would show for one log line.

    Progress bars (tqdm) rewrite a line with carriage returns: keep the last non-empty segment. ANSI colour
    and cursor sequences are removed, trailing whitespace is stripped.
    """
    segments = [seg for seg in raw.split("\r") if seg.strip()]
    text = segments[-1] if segments else ""
    return _ANSI_RE.sub("", text).rstrip()


def parse_number(text: str | None, suffix: str | None = "") -> float | None:
    """``"19.5", "K"`` -> 19500.0; ``"1,234"`` -> 1234.0; ``"nan"`` -> None (not a usable number)."""
    if text is None:
        return None
    text = text.strip()
    if not text or not _NUMBER_RE.match(text) or not any(ch.isdigit() for ch in text):
        return None
    multiplier = SUFFIX_MULTIPLIERS.get((suffix or "").strip().lower())
    if multiplier is None:
        return None
    return float(text.replace(",", "")) * multiplier


def _number_from_match(match: re.Match) -> float | None:
    """The first group that parses as a number, scaled by the unit suffix in the group right after it."""
    groups = match.groups()
    if not groups:
        return parse_number(match.group(0))
    for index, group in enumerate(groups):
        value = parse_number(group)
        if value is None:
            continue
        suffix = groups[index + 1] if index + 1 < len(groups) else ""
        if suffix is not None and suffix.strip().lower() in SUFFIX_MULTIPLIERS:
            return parse_number(group, suffix)
        return value
    return None


def _loss_from_match(match: re.Match) -> tuple[float | None, str]:
    """Loss value and the raw text; ``nan``/``inf`` give ``None`` plus the raw text (JSON has no NaN)."""
    raw = next((g for g in match.groups() if g is not None), match.group(0)) if match.groups() else match.group(0)
    raw = raw.strip()
    value = parse_number(raw)
    return value, raw


def parse_training_log(
    lines: list[str],
    step_regex: str | re.Pattern = DEFAULT_STEP_REGEX,
    throughput_regex: str | re.Pattern = DEFAULT_THROUGHPUT_REGEX,
    loss_regex: str | re.Pattern = DEFAULT_LOSS_REGEX,
) -> dict:
    """Parse the newest step, throughput (tokens/s) and loss from the tail of a training log.

    Lines are scanned from the end. ``last_step`` comes from the newest line the step regex matches and
    ``line`` is that line; throughput and loss come from the newest line that has them (often the same line,
    but a run may log them separately). The step regex's first group is the step number.
    """
    step_re = re.compile(step_regex) if isinstance(step_regex, str) else step_regex
    thr_re = re.compile(throughput_regex) if isinstance(throughput_regex, str) else throughput_regex
    loss_re = re.compile(loss_regex) if isinstance(loss_regex, str) else loss_regex

    result: dict = {"last_step": None, "line": None, "throughput_tok_s": None, "loss": None, "loss_text": None}
    have_step = have_thr = have_loss = False
    for raw in reversed(lines):
        line = clean_line(raw)
        if not line:
            continue
        if not have_step:
            match = step_re.search(line)
            if match:
                step_text = next((g for g in match.groups() if g is not None), None) if match.groups() else None
                step_text = step_text if step_text is not None else match.group(0)
                digits = re.sub(r"[^\d]", "", step_text)
                if digits:
                    result["last_step"] = int(digits)
                    result["line"] = line
                    have_step = True
        if not have_thr:
            match = thr_re.search(line)
            if match:
                value = _number_from_match(match)
                if value is not None:
                    result["throughput_tok_s"] = value
                    have_thr = True
        if not have_loss:
            match = loss_re.search(line)
            if match:
                result["loss"], result["loss_text"] = _loss_from_match(match)
                have_loss = True
        if have_step and have_thr and have_loss:
            break
    return result


def split_lines(data: bytes) -> list[str]:
    """Decode log bytes (invalid UTF-8 replaced) and split into lines without line endings."""
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def read_tail(path: str, lines: int = 20, max_bytes: int = 1 << 20, block: int = 64 * 1024) -> list[str]:
    """The last ``lines`` lines of ``path``, reading backwards at most ``max_bytes`` bytes.

    Never blocks: the file is opened with ``O_NONBLOCK`` and must be a regular file (a FIFO, a device or a
    directory raises ``OSError``); a huge file costs at most ``max_bytes`` read from its end.
    Raises ``OSError`` when the file cannot be opened or read (the caller turns it into a warning).
    """
    if lines <= 0:
        return []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else (
                "a directory" if stat.S_ISDIR(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
            )
            raise OSError(errno.EINVAL, f"{path} is {kind}, not a regular log file")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        end = handle.tell()
        pos = end
        chunks: list[bytes] = []
        newlines = 0
        while pos > 0 and newlines <= lines and end - pos < max_bytes:
            size = min(block, pos, max_bytes - (end - pos))
            pos -= size
            handle.seek(pos)
            chunk = handle.read(size)
            chunks.append(chunk)
            newlines += chunk.count(b"\n")
    data = b"".join(reversed(chunks))
    result = split_lines(data)
    if pos > 0 and result:
        result = result[1:]  # the first line is cut in the middle
    return result[-lines:]


def step_from_name(name: str) -> int | None:
    """The last run of digits in a checkpoint name: ``checkpoint-5380`` -> 5380, ``epoch3_step200.pt`` -> 200."""
    runs = re.findall(r"\d+", os.path.basename(name.rstrip("/")))
    return int(runs[-1]) if runs else None


def newest_entry(entries: list[tuple[str, float]]) -> tuple[str, float] | None:
    """The entry with the newest mtime; ties go to the higher step number, then the name."""
    if not entries:
        return None
    return max(entries, key=lambda e: (e[1], step_from_name(e[0]) or -1, e[0]))


def _iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).isoformat(timespec="seconds")


def describe_checkpoint(directory: str, entries: list[tuple[str, float]], now: float) -> dict:
    """Result dict for the newest entry of ``entries`` (pure)."""
    newest = newest_entry(entries)
    if newest is None:
        return {
            "dir": directory,
            "path": None,
            "name": None,
            "step": None,
            "mtime": None,
            "mtime_iso": None,
            "age_s": None,
            "count": 0,
        }
    path, mtime = newest
    return {
        "dir": directory,
        "path": path,
        "name": os.path.basename(path.rstrip("/")),
        "step": step_from_name(path),
        "mtime": mtime,
        "mtime_iso": _iso(mtime),
        "age_s": round(max(0.0, now - mtime), 3),
        "count": len(entries),
    }


def checkpoint_glob_problem(pattern: str) -> str | None:
    """Why ``pattern`` could reach outside the checkpoint directory (absolute, a ``..`` part), or None."""
    if pattern.startswith(("/", "~")) or os.path.isabs(pattern):
        return "is absolute; give a glob relative to checkpoint_dir, e.g. 'checkpoint-*'"
    if ".." in pattern.replace("\\", "/").split("/"):
        return "has a '..' part, which leaves checkpoint_dir; give a glob inside it, e.g. 'checkpoint-*'"
    if "\0" in pattern:
        return "holds a NUL character"
    return None


def find_newest_checkpoint(directory: str, pattern: str = DEFAULT_CHECKPOINT_GLOB, now: float | None = None) -> dict:
    """Newest entry (file or directory) in ``directory`` matching the glob ``pattern``.

    Raises ``OSError`` when ``directory`` does not exist or is not a readable directory.
    """
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory} is not a directory")
    os.listdir(directory)  # raises PermissionError when unreadable
    problem = checkpoint_glob_problem(pattern)
    if problem:
        raise ValueError(f"checkpoint_glob={pattern!r} {problem}")
    root = os.path.realpath(directory)
    entries: list[tuple[str, float]] = []
    for path in glob.glob(os.path.join(glob.escape(directory), pattern)):
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            continue  # a symbolic link out of the run's directory
        try:
            entries.append((path, os.stat(path).st_mtime))
        except OSError:
            continue  # vanished between glob and stat (a checkpoint being rotated)
    return describe_checkpoint(directory, entries, time.time() if now is None else now)


def describe_log(path: str, lines: list[str], parsed: dict, mtime: float | None, now: float) -> dict:
    """Result dict for a log tail (pure)."""
    result = {"path": path, "tail": lines, "mtime": mtime, "age_s": None}
    if mtime is not None:
        result["age_s"] = round(max(0.0, now - mtime), 3)
    result.update(parsed)
    return result
