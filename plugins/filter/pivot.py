# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters the pivot roles use to turn recorded facts into a plan (pure: data in, data out).

- ``systemd_unit_parse``: a unit file's text -> ordered sections and entries (so a role can re-render the SAME
  unit with only ExecStart changed, every other line kept).
- ``systemd_unit_set_env``, ``systemd_unit_env_names``: set one variable in a parsed unit's ``Environment=``
  lines; the names (never the values) a unit file's or drop-in's ``Environment=`` lines set.
- ``systemd_exec_lines``: an argv list -> ExecStart lines, the command on the first line and one flag (with its
  values) per following line, each word quoted for systemd.
- ``dflash_drafter_check``: a drafter's and a target's config.json (and the plugin's resolved drafter) -> whether
  the drafter fits the target, with one readable error per problem.
- ``sglang_ddtree_cli``: a run of the plugin's own ``python -m sglang_ddtree check-drafter|check-sglang`` -> its
  report, ``ok`` and the problems (each naming the field and the fix).
- ``sglang_flag``: the value of a flag in an argv (host, port, TP size, ... of the server).
- ``generation_compare``: two generation probes (the old server's baseline, the new server's run of the same
  greedy prompts) -> per-prompt agreement with the first diverging token, tokens/s before and after, the
  acceptance length, and the opt-in gate's verdict.
- ``pip_freeze_find``: one distribution's line in a ``pip freeze`` snapshot (absent, ``==version``, ``@ url``).

The new ExecStart itself is computed by ``specdec.pivot.sglang_capabilities`` (``speculative_flags``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.specdec.pivot.plugins.module_utils import (
    _exec_start,
    _secrets,
    _systemd_cmdline,
    _systemd_unit,
)

# --------------------------------------------------------------------------------------------------------------
# systemd unit files


def systemd_unit_parse(text: str) -> list[dict[str, Any]]:
    """Parse a systemd unit file into ``[{name, entries: [{key, value} | {comment}]}]``.

    Continuation lines (a trailing backslash) are joined with a single space, as systemd does. Comment lines
    inside a section are kept (so re-rendering is faithful); comments and blank lines before the first section
    are left out (``systemd_unit_header`` returns them).
    """
    if not isinstance(text, str):
        raise AnsibleFilterError(
            f"systemd_unit_parse expects the unit file's text (a string), got {type(text).__name__}"
        )
    sections: list[dict[str, Any]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line:
            continue
        if line[0] in "#;":
            if sections:
                sections[-1]["entries"].append({"comment": line})
            continue
        if line.startswith("[") and line.endswith("]"):
            sections.append({"name": line[1:-1].strip(), "entries": []})
            continue
        # key=value, possibly continued over several lines
        parts = [line]
        while parts[-1].endswith("\\") and i < len(lines):
            parts[-1] = parts[-1][:-1].rstrip()
            nxt = lines[i].strip()
            i += 1
            if nxt[:1] in ("#", ";"):  # systemd ignores comment lines inside a continuation
                parts.append("\\")
                continue
            parts.append(nxt)
        if parts[-1].endswith("\\"):
            parts[-1] = parts[-1][:-1].rstrip()
        joined = " ".join(p for p in parts if p and p != "\\")
        if "=" not in joined:
            raise AnsibleFilterError(
                f"systemd_unit_parse: line {joined!r} is neither a section, a comment nor key=value"
            )
        if not sections:
            raise AnsibleFilterError(f"systemd_unit_parse: {joined!r} appears before any [Section] header")
        key, value = joined.split("=", 1)
        sections[-1]["entries"].append({"key": key.strip(), "value": value.strip()})
    return sections


def systemd_unit_header(text: str) -> list[str]:
    """The comment lines before a unit file's first section (blank lines dropped), e.g. the operator's notes.

    ``systemd_unit_parse`` leaves them out; the unit template writes them back after its ``ansible_managed``
    block (and strips that block when the file was already rendered once), so notes survive the re-template.
    """
    if not isinstance(text, str):
        raise AnsibleFilterError(
            f"systemd_unit_header expects the unit file's text (a string), got {type(text).__name__}"
        )
    header: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            break
        if line[:1] in ("#", ";"):
            header.append(line)
    return header


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def systemd_unit_set_env(sections: Any, name: str, value: Any) -> list[dict[str, Any]]:
    """``sections`` (``systemd_unit_parse``) with the variable ``name`` set to ``value`` in [Service]'s
    ``Environment=`` lines, every other line kept as it is.

    An ``Environment=`` line that is exactly ``name=value`` stays where it is (a second run changes nothing); every
    other assignment of ``name`` is taken out of its line (a line left empty is dropped; the others are written
    back word by word, quoted as systemd reads them); without such a line, ``Environment=name=value`` goes after
    the last ``Environment=`` line of [Service], or at its end.
    """
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        raise AnsibleFilterError(f"systemd_unit_set_env: name={name!r} is not an environment variable name")
    if not isinstance(value, (str, int)) or isinstance(value, bool) or any(c in str(value) for c in "\n\r\x00"):
        raise AnsibleFilterError(f"systemd_unit_set_env: value={value!r} for {name} must be one line of text")
    if not isinstance(sections, Sequence) or not any(
        isinstance(s, Mapping) and s.get("name") == "Service" for s in sections
    ):
        raise AnsibleFilterError("systemd_unit_set_env: the unit has no [Service] section (systemd_unit_parse output)")
    wanted = f"{name}={value}"
    out: list[dict[str, Any]] = []
    for section in sections:
        if section.get("name") != "Service":
            out.append(section)
            continue
        entries: list[dict[str, Any]] = []
        kept_exact = False
        last_env = -1
        for entry in section.get("entries", []):
            if entry.get("key") != "Environment":
                entries.append(entry)
                continue
            words = _systemd_cmdline.split_command_line(str(entry.get("value", "")), separators=False)
            others = [w for w in words if not w.startswith(name + "=")]
            if len(others) == len(words):
                entries.append(entry)
            elif words == [wanted] and not kept_exact:
                kept_exact = True
                entries.append(entry)
            elif others:
                entries.append({"key": "Environment", "value": " ".join(map(_systemd_cmdline.quote_word, others))})
            else:
                continue
            last_env = len(entries) - 1
        if not kept_exact:
            entries.insert(last_env + 1 if last_env >= 0 else len(entries),
                           {"key": "Environment", "value": _systemd_cmdline.quote_word(wanted)})
        out.append({**section, "entries": entries})
    return out


def systemd_unit_env_names(text: Any, reset_marker: str | None = None) -> list[str]:
    """The names of the variables a unit file's (or a drop-in's) ``Environment=`` lines set, sorted; never a value.
    With ``reset_marker``, the marker is in the list too when the text has an empty ``Environment=`` in [Service]
    (in a drop-in it drops every ``Environment=`` the unit file and earlier drop-ins set).

    Read as systemd reads it: lines, sections, comments and continuation lines by module_utils
    ``_systemd_unit.unit_file_entries``, each line's words (quotes, C escapes) by
    ``_systemd_cmdline.split_command_line``. Only [Service] counts; a word sets a variable when it is ``NAME=...``
    with a valid name (systemd ignores any other word); an empty ``Environment=`` resets the list, so what this text
    set before it is left out; of a line with an unterminated quote, the words before it count. None is no text.
    """
    if text is None:
        return []
    if not isinstance(text, str):
        raise AnsibleFilterError(
            f"systemd_unit_env_names expects a unit file's text (a string), got {type(text).__name__}"
        )
    names: list[str] = []
    reset = False
    for section, key, value in _systemd_unit.unit_file_entries(text):
        if section != "Service" or key != "Environment":
            continue
        if not value:
            names, reset = [], True  # "Environment=" resets the list
            continue
        for word in _systemd_cmdline.split_command_line(value, separators=False, partial=True):
            name = word.split("=", 1)[0]
            if "=" in word and _ENV_NAME.fullmatch(name):
                names.append(name)
    if reset and reset_marker is not None:
        names.append(str(reset_marker))
    return sorted(set(names))


_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./${}\-]+$")


def systemd_quote(word: str) -> str:
    """Quote one argv word for an ExecStart line (systemd.service "Command lines").

    The words are in the unit file's form, as ``sglang_capabilities`` returns them (``unit.argv``,
    ``exec_start_new.argv``): ``%`` specifiers and ``$VAR`` references as the unit writes them, literal values
    already escaped (``%%``, ``$$``; module_utils ``_systemd_cmdline.systemd_escape``), so nothing is escaped twice
    here.
    Words with whitespace, quotes, backslashes or ``;`` are double-quoted with backslash escapes; an empty word
    becomes ``""``.
    """
    word = str(word)
    if word and _SAFE_WORD.match(word) and word != ";":
        return word
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


def systemd_exec_lines(argv: Sequence[str]) -> list[str]:
    """Group an argv into ExecStart lines: command (and ``-m module``) first, then one ``--flag values...`` per line.

    The caller joins them with ``" \\\\\\n    "``. Only words that start with ``--`` open a new line, so values such as
    ``-1`` stay with their flag and ``python -m pkg`` stays on the first line.
    """
    if isinstance(argv, str) or not isinstance(argv, Sequence) or not argv:
        raise AnsibleFilterError(f"systemd_exec_lines expects a non-empty list of argv words, got {argv!r}")
    groups: list[list[str]] = [[str(argv[0])]]
    for word in argv[1:]:
        word = str(word)
        if word.startswith("--") and len(word) > 2:
            groups.append([word])
        else:
            groups[-1].append(word)
    return [" ".join(systemd_quote(w) for w in g) for g in groups]


# --------------------------------------------------------------------------------------------------------------
# DFlash drafter compatibility


def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs (Qwen3.5/3.6) keep the language model's sizes under ``text_config``."""
    inner = cfg.get("text_config")
    if isinstance(inner, Mapping) and "num_hidden_layers" not in cfg:
        merged = dict(cfg)
        merged.update(inner)
        return merged
    return cfg


def _first(cfg: Mapping[str, Any], *paths: str) -> Any:
    for path in paths:
        node: Any = cfg
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                node = None
                break
            node = node[part]
        if node is not None:
            return node
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def dflash_drafter_check(
    drafter_cfg: Mapping[str, Any],
    target_cfg: Mapping[str, Any],
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Check that a DFlash drafter fits its TARGET: the drafter/target half of the drafter check.

    Whether the drafter itself can be served (architecture, block size, mask token, layer shapes, what DDTREE in
    SGLang honours) is the plugin's own check, ``python -m sglang_ddtree check-drafter PATH --consumer sglang``;
    ``spec`` is that check's resolved drafter (its ``spec``), whose ``target_layer_ids`` (z-lab's default when the
    config names only ``num_target_layers``) and ``block_size`` are used when given. This filter only compares
    the drafter with the target: its target layers inside the target's, ``num_target_layers`` equal to them, the
    same ``vocab_size`` and ``hidden_size`` (the drafter shares the target's embeddings and lm_head), and a
    ``mask_token_id`` inside the vocabulary.

    Returns ``{ok, errors, drafter, target}``; ``drafter`` holds architectures, block_size, target_layer_ids,
    mask_token_id, hidden/vocab sizes; ``target`` the target's layer count and sizes.
    """
    if not isinstance(drafter_cfg, Mapping) or not isinstance(target_cfg, Mapping):
        raise AnsibleFilterError("dflash_drafter_check expects two dicts: the drafter's and the target's config.json")
    if spec is not None and not isinstance(spec, Mapping):
        raise AnsibleFilterError("dflash_drafter_check: spec must be the plugin check's 'spec' (a dict) or None")
    spec = spec or {}
    target = _text_config(target_cfg)
    errors: list[str] = []

    block_size = spec.get("block_size", _first(drafter_cfg, "dflash_config.block_size", "block_size"))
    layer_ids = spec.get("target_layer_ids", _first(drafter_cfg, "dflash_config.target_layer_ids", "target_layer_ids"))
    if isinstance(layer_ids, tuple):
        layer_ids = list(layer_ids)
    t_layers = target.get("num_hidden_layers")
    if not _is_int(t_layers) or t_layers < 1:
        errors.append(f"target config has no usable num_hidden_layers ({t_layers!r})")
    if not isinstance(layer_ids, list) or not layer_ids or not all(_is_int(x) for x in layer_ids):
        errors.append(f"drafter target_layer_ids is {layer_ids!r}; expected a non-empty list of layer indices")
    elif _is_int(t_layers):
        bad = [x for x in layer_ids if not 0 <= x < t_layers]
        if bad:
            errors.append(
                f"drafter target_layer_ids {bad} are outside the target's {t_layers} layers (0..{t_layers - 1}): "
                "the drafter was trained for a different target"
            )
    n_target = _first(drafter_cfg, "dflash_config.num_target_layers", "num_target_layers")
    if _is_int(n_target) and _is_int(t_layers) and n_target != t_layers:
        errors.append(f"drafter num_target_layers {n_target} != target num_hidden_layers {t_layers}")
    for key in ("vocab_size", "hidden_size"):
        d_val, t_val = drafter_cfg.get(key), target.get(key)
        if d_val is None or t_val is None:
            errors.append(f"{key} missing (drafter {d_val!r}, target {t_val!r}); cannot prove the drafter fits")
        elif d_val != t_val:
            errors.append(
                f"drafter {key} {d_val} != target {key} {t_val}: the drafter shares the target's "
                "embeddings and lm_head, so they must match"
            )
    mask_id = spec.get("mask_token_id", _first(drafter_cfg, "dflash_config.mask_token_id", "mask_token_id"))
    vocab = target.get("vocab_size")
    if _is_int(mask_id) and _is_int(vocab) and not 0 <= mask_id < vocab:
        errors.append(f"drafter mask_token_id {mask_id} is outside the vocabulary (size {vocab})")
    return {
        "ok": not errors,
        "errors": errors,
        "drafter": {
            "architectures": list(drafter_cfg.get("architectures") or []),
            "block_size": block_size,
            "target_layer_ids": layer_ids,
            "mask_token_id": mask_id,
            "num_hidden_layers": drafter_cfg.get("num_hidden_layers"),
            "hidden_size": drafter_cfg.get("hidden_size"),
            "vocab_size": drafter_cfg.get("vocab_size"),
        },
        "target": {
            "architectures": list(target_cfg.get("architectures") or []),
            "num_hidden_layers": t_layers,
            "hidden_size": target.get("hidden_size"),
            "vocab_size": vocab,
        },
    }


# --------------------------------------------------------------------------------------------------------------
# The plugin's own CLI (python -m sglang_ddtree check-drafter / check-sglang), run on the host


def _last_json_object(text: str) -> Mapping[str, Any] | None:
    """The last JSON object in ``text`` that starts at the beginning of a line (the CLI prints one, indented;
    anything SGLang may print around it is skipped)."""
    import json

    decoder = json.JSONDecoder()
    found = None
    for match in re.finditer(r"(?m)^\{", text):
        try:
            obj, _end = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(obj, Mapping):
            found = obj
    return found


def sglang_ddtree_cli(result: Mapping[str, Any], command: str) -> dict[str, Any]:
    """A registered run of ``python -m sglang_ddtree COMMAND`` (``rc``, ``stdout``, ``stderr``; a command task's or
    an ``async_status`` result) -> the CLI's report with ``ok``, ``problems`` (a list, each naming the field and the
    fix for check-drafter; the one ``problem`` for check-sglang) and ``rc``. A run that printed no report (the
    interpreter could not import the plugin or its dependencies, say) is ``ok: false`` with the exit status and the
    last lines it wrote to stderr; for check-sglang ``implementation`` is then ``None``."""
    if not isinstance(result, Mapping):
        raise AnsibleFilterError("sglang_ddtree_cli expects a registered command result (rc, stdout, stderr)")
    if command not in ("check-drafter", "check-sglang"):
        raise AnsibleFilterError(f"sglang_ddtree_cli: command {command!r} is not check-drafter or check-sglang")
    rc = result.get("rc")
    report = _last_json_object(str(result.get("stdout") or ""))
    if report is None:
        err = [line.strip() for line in str(result.get("stderr") or result.get("msg") or "").splitlines()]
        err = [line for line in err if line][-3:]
        problem = f"python -m sglang_ddtree {command} exited with status {rc} and printed no report" + (
            f": {' | '.join(err)}" if err else ""
        )
        out: dict[str, Any] = {"ok": False, "ran": False, "rc": rc, "problems": [problem], "problem": problem}
        if command == "check-sglang":
            out.update(implementation=None, detail=None, plugin_status=None)
        return out
    out = dict(report)
    out["ran"] = True
    out["rc"] = rc
    out["ok"] = bool(report.get("ok")) and rc == 0
    if command == "check-drafter":
        problems = [str(p) for p in report.get("problems") or []]
        if not out["ok"] and not problems:
            problems = [f"python -m sglang_ddtree check-drafter exited with status {rc}"]
        out["problems"] = problems
    else:
        problem = report.get("problem")
        out["problems"] = [str(problem)] if problem else []
    return out


#: ``sglang_flag``'s ``type``: how SGLang's argparse reads the flag.
SGLANG_FLAG_TYPES = ("raw", "int", "float", "bool")


def sglang_flag(
    argv: Sequence[str], names: str | Sequence[str], default: Any = None, type: str = "raw"
) -> Any:
    """Value of the last occurrence of a flag in an argv (``--flag value`` or ``--flag=value``), else ``default``.

    ``names`` may list aliases (``["--tp-size", "--tensor-parallel-size", "--tp"]``). With ``type`` ``raw`` (the
    default) the value is the word as written, and a flag given without a value (followed by another flag or at the
    end) yields ``True``. The other types read the value as SGLang's argparse does and raise
    :class:`AnsibleFilterError` (naming the flag, the value and the fix) where it would refuse the command line:

    - ``int`` / ``float``: an option with ``type=int`` / ``type=float`` (``--max-running-requests``,
      ``--mamba-full-memory-ratio``): ``int(word)`` / ``float(word)``; a missing value is an error. A word with a
      systemd variable (``${N}``, ``$N``: expanded only when the command starts) is not known here: ``default``.
    - ``bool``: a switch (``action="store_true"``, ``--disable-radix-cache``): present is ``True``, absent is
      ``default`` (``False`` when that is None); ``--flag=value`` or a word after the switch that is not a flag is an
      error (argparse: "ignored explicit argument", "unrecognized arguments").
    """
    if type not in SGLANG_FLAG_TYPES:
        raise AnsibleFilterError(f"sglang_flag: type={type!r}, choose one of {', '.join(SGLANG_FLAG_TYPES)}")
    if isinstance(names, str):
        names = [names]
    value = default if default is not None or type != "bool" else False
    words = [str(w) for w in argv]
    fix = "fix it in the unit's ExecStart (or sglang_preflight_extra_args)"
    for i, word in enumerate(words):
        for name in names:
            nxt = words[i + 1] if i + 1 < len(words) else None
            if word == name:
                given = None if nxt is None or nxt.startswith("--") else nxt
            elif word.startswith(name + "="):
                given = word[len(name) + 1 :]
            else:
                continue
            if type == "raw":
                value = True if given is None else given
            elif type == "bool":
                if word != name:
                    raise AnsibleFilterError(
                        f"{word!r}: {name} is a switch without a value (SGLang's argparse: store_true), so SGLang "
                        f"refuses '=value' after it; write {name} alone to set it, or leave it out; {fix}"
                    )
                if given is not None:
                    raise AnsibleFilterError(
                        f"{name} {given!r}: {name} is a switch without a value (SGLang's argparse: store_true), so "
                        f"SGLang refuses {given!r} after it as an unrecognized argument; {fix}"
                    )
                value = True
            else:
                number = {"int": "an integer", "float": "a number"}[type]
                if given is None:
                    raise AnsibleFilterError(
                        f"{name} has no value: SGLang's argparse expects one argument, {number}; {fix}"
                    )
                if "$" in given:  # $VAR / ${VAR}: systemd expands it when it starts the command; unknown here
                    value = default
                    continue
                try:
                    value = int(given) if type == "int" else float(given)
                except ValueError:
                    raise AnsibleFilterError(
                        f"{name}={given!r}: not {number} (SGLang's argparse reads it with type={type} and refuses "
                        f"the command line); {fix}"
                    ) from None
    return value


# --------------------------------------------------------------------------------------------------------------
# Baseline comparison and gate


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (the shorter length when one is a prefix of the
    other); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def generation_compare(
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
    min_speedup: Any = 0,
    max_disagreements: Any = -1,
    min_accept_length: Any = 0,
) -> dict[str, Any]:
    """Compare the new server's run of the baseline prompts with the old server's (both greedy).

    ``before``/``after`` are outputs of the sglang_service role's ``generation_probe.py`` (``ok``, ``results``
    with ``prompt``, ``output_ids``, ``text``, ``completion_tokens``, ``spec_accept_length``; ``tokens_per_s``;
    ``server``). ``before`` may be None (no baseline was taken). Returns ``{prompts, agreeing, disagreeing,
    per_prompt: [{index, prompt, agree, first_divergence, unit, before_tokens, after_tokens, before_text,
    after_text}], tokens_per_s: {before, after}, speedup, accept_length: {mean_per_request, server_avg},
    gate: {enabled, passed, failures, min_speedup, max_disagreements, min_accept_length}}``.

    Greedy decoding is lossless for both algorithms, so a disagreement is a warning worth reporting (numerics
    can differ between kernels); it fails the gate only when ``max_disagreements`` >= 0 is exceeded. The gate's
    other limits: ``min_speedup`` > 0 (after/before tokens/s) and ``min_accept_length`` > 0 (mean of the
    requests' ``spec_accept_length``, else the server's ``avg_spec_accept_length``). A limit that cannot be
    evaluated (no baseline, no acceptance length reported) fails the gate, with the reason.
    """
    if after is not None and not isinstance(after, Mapping):
        raise AnsibleFilterError(f"generation_compare expects the probe results as dicts, got {type(after).__name__}")
    if before is not None and not isinstance(before, Mapping):
        raise AnsibleFilterError(f"generation_compare expects the probe results as dicts, got {type(before).__name__}")
    try:
        min_speedup_f = float(min_speedup or 0)
        max_dis = int(-1 if max_disagreements is None or max_disagreements == "" else max_disagreements)
        min_accept_f = float(min_accept_length or 0)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"generation_compare: gate limits must be numbers ({exc})") from exc
    b_ok = bool(before and before.get("ok"))
    a_ok = bool(after and after.get("ok"))
    b_results = list(before.get("results") or []) if b_ok else []
    a_results = list(after.get("results") or []) if a_ok else []

    per_prompt: list[dict[str, Any]] = []
    if b_ok and a_ok:
        if len(b_results) != len(a_results):
            raise AnsibleFilterError(
                f"generation_compare: the baseline has {len(b_results)} prompts and the new run {len(a_results)}"
            )
        for i, (b, a) in enumerate(zip(b_results, a_results, strict=True)):
            b_ids, a_ids = b.get("output_ids"), a.get("output_ids")
            if isinstance(b_ids, list) and isinstance(a_ids, list):
                div, unit = _first_divergence(b_ids, a_ids), "token"
            else:
                div, unit = _first_divergence(str(b.get("text") or ""), str(a.get("text") or "")), "char"
            per_prompt.append(
                {
                    "index": i,
                    "prompt": str(b.get("prompt", ""))[:200],
                    "agree": div is None,
                    "first_divergence": div,
                    "unit": unit,
                    "before_tokens": b.get("completion_tokens"),
                    "after_tokens": a.get("completion_tokens"),
                    "before_text": str(b.get("text") or "")[:400],
                    "after_text": str(a.get("text") or "")[:400],
                }
            )
    agreeing = sum(1 for p in per_prompt if p["agree"])
    b_tps = _num(before.get("tokens_per_s")) if b_ok else None
    a_tps = _num(after.get("tokens_per_s")) if a_ok else None
    speedup = round(a_tps / b_tps, 3) if a_tps is not None and b_tps else None
    per_request = [v for v in (_num(r.get("spec_accept_length")) for r in a_results) if v is not None]
    server_avg = _num(((after or {}).get("server") or {}).get("avg_spec_accept_length")) if a_ok else None
    accept = _mean(per_request) if per_request else server_avg

    failures: list[str] = []
    if not a_ok:
        failures.append(f"the new server's probe failed: {(after or {}).get('error') or 'no result'}")
    if min_speedup_f > 0:
        if speedup is None:
            failures.append(f"minimum speedup {min_speedup_f:g}x set, but there is no baseline tokens/s to compare")
        elif speedup < min_speedup_f:
            failures.append(
                f"speedup {speedup:g}x ({a_tps:.1f} tok/s after vs {b_tps:.1f} before) is below the minimum "
                f"{min_speedup_f:g}x (sglang_service_gate_min_speedup)"
            )
    if max_dis >= 0:
        if not b_ok:
            failures.append(f"at most {max_dis} disagreeing prompts allowed, but there is no baseline to compare with")
        elif len(per_prompt) - agreeing > max_dis:
            worst = [p for p in per_prompt if not p["agree"]]
            failures.append(
                f"{len(worst)} of {len(per_prompt)} prompts disagree with the baseline (allowed "
                f"{max_dis}, sglang_service_gate_max_disagreements); first: prompt {worst[0]['index']} diverges "
                f"at {worst[0]['unit']} {worst[0]['first_divergence']}"
            )
    if min_accept_f > 0:
        if accept is None:
            failures.append(
                f"minimum acceptance length {min_accept_f:g} set, but the server reports none "
                "(meta_info.spec_accept_length / avg_spec_accept_length)"
            )
        elif accept < min_accept_f:
            failures.append(
                f"acceptance length {accept:g} is below the minimum {min_accept_f:g} "
                "(sglang_service_gate_min_accept_length)"
            )
    enabled = min_speedup_f > 0 or max_dis >= 0 or min_accept_f > 0
    return {
        "baseline": b_ok,
        "prompts": len(per_prompt),
        "agreeing": agreeing,
        "disagreeing": len(per_prompt) - agreeing,
        "per_prompt": per_prompt,
        "tokens_per_s": {"before": b_tps, "after": a_tps},
        "speedup": speedup,
        "accept_length": {"mean_per_request": _mean(per_request), "server_avg": server_avg, "value": accept},
        "gate": {
            "enabled": enabled,
            "passed": not (enabled and failures),
            "failures": failures if enabled else [],
            "min_speedup": min_speedup_f,
            "max_disagreements": max_dis,
            "min_accept_length": min_accept_f,
        },
    }


# --------------------------------------------------------------------------------------------------------------
# pip freeze snapshots

_CANON = re.compile(r"[-_.]+")
_FREEZE_LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(?P<rest>.*)$")


def pip_freeze_find(text: str, name: str) -> dict[str, Any]:
    """Find distribution ``name`` in the text of a ``pip freeze`` snapshot.

    Returns ``{present, version, url, line}``: ``name==1.2`` gives the version; ``name @ file:///w/x.whl`` gives
    the url (and the version from a wheel file name, when it is one); an editable ``-e`` line gives the url.
    Names compare the way pip does (case-insensitive, ``-``, ``_`` and ``.`` alike). Absent: present false.
    """
    if not isinstance(text, str) or not isinstance(name, str) or not name:
        raise AnsibleFilterError("pip_freeze_find expects the snapshot's text and a distribution name")
    want = _CANON.sub("-", name).lower()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-e "):
            egg = re.search(r"#egg=([A-Za-z0-9._-]+)", line)
            if egg and _CANON.sub("-", egg.group(1)).lower() == want:
                return {"present": True, "version": None, "url": line[3:].strip(), "line": line}
            continue
        m = _FREEZE_LINE.match(line)
        if not m or _CANON.sub("-", m.group("name")).lower() != want:
            continue
        rest = m.group("rest").strip()
        if rest.startswith("=="):
            return {"present": True, "version": rest[2:].strip(), "url": None, "line": line}
        if rest.startswith("@"):
            url = rest[1:].strip()
            version = None
            wheel = re.search(r"/([^/]+)\.whl$", url)
            if wheel and len(wheel.group(1).split("-")) >= 5:
                version = wheel.group(1).split("-")[1]
            return {"present": True, "version": version, "url": url, "line": line}
        return {"present": True, "version": None, "url": None, "line": line}
    return {"present": False, "version": None, "url": None, "line": None}


# --------------------------------------------------------------------------------------------------------------
# secrets in a unit: API keys on the command line, tokens in the environment

#: SGLang flags whose value is a secret (the policy is module_utils ``_secrets``, shared with the modules).
SECRET_FLAGS = _secrets.SECRET_FLAGS
MASK = _secrets.MASK
_VAR_RE = re.compile(r"^\$(?:\{(\w+)\}|(\w+))$")


def pivot_secrets(
    argv: Sequence[str] | str | None,
    environment: Mapping[str, Any] | str | None = None,
    env_files: Sequence[str] | None = None,
    extra_args: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The secrets a unit carries: ``{"api_key", "admin_api_key", "secret_values", "names", "values", "argv"}``.

    ``argv``: the command line as words, or the unit file's text (its ExecStart is read as systemd reads it).
    ``environment``: the ``Environment=`` values as a dict, or the ``Environment`` property of ``systemctl show``.
    ``env_files``: the ``EnvironmentFile=`` texts (they override ``Environment=``). ``extra_args``: words the new
    command line adds (``sglang_preflight_extra_args``): a key there is a secret too (``values``).
    ``api_key``/``admin_api_key``: the last value of ``--api-key``/``--admin-api-key`` (``--flag v``, ``--flag=v``
    or an abbreviation argparse accepts; ``$VAR`` resolved from the environment as systemd does), else None.
    ``values``: ``{name: value}`` of every secret by module_utils ``_secrets.unit_secrets`` (the names
    ``sglang_capabilities`` uses in its ``{secret:NAME}`` markers, for :func:`pivot_unmask`); ``secret_values``:
    those values and the keys, longest first, for :func:`pivot_mask`; ``names``: their names, never a value;
    ``argv``: the words of the command line.
    """
    assignments: dict[str, str] = {}
    if isinstance(argv, str):
        commands = _systemd_unit.unit_exec_starts([argv])
        if not commands:
            raise AnsibleFilterError("pivot_secrets: the unit file's text has no ExecStart= in [Service]")
        try:
            parsed = _exec_start.parse_exec_start(commands[0])
        except ValueError as exc:
            raise AnsibleFilterError(f"pivot_secrets: cannot parse the unit's ExecStart: {exc}") from exc
        words, assignments = parsed["argv"], parsed["env_assignments"]
    else:
        words = [str(w) for w in (argv or [])]
    if isinstance(environment, str):
        unit_env = _systemd_unit.parse_environment_property(environment)
    else:
        unit_env = {str(k): "" if v is None else str(v) for k, v in (environment or {}).items()}
    env = dict(unit_env)
    for text in env_files or []:  # systemd: EnvironmentFile= overrides Environment=
        env.update(_systemd_unit.parse_environment_file(str(text)))
    more = [str(w) for w in (extra_args or [])]
    values = _secrets.unit_secrets([*words, *more], unit_env, env, assignments)
    keys: dict[str, str] = {}
    # the unit's own keys (the old server checks them); --api-key ${API_KEY}: systemd substitutes it
    for name, value in _secrets.flag_secrets(words):
        m = _VAR_RE.match(value)
        keys[name] = env.get(m.group(1) or m.group(2), "") if m else value
    secret_values = sorted({v for v in [*values.values(), *keys.values()] if v}, key=lambda v: (-len(v), v))
    return {
        "api_key": keys.get("--api-key") or None,
        "admin_api_key": keys.get("--admin-api-key") or None,
        "secret_values": secret_values,
        "names": sorted({n.split("#", 1)[0] for n in values} | {n for n, v in keys.items() if v}),
        "values": values,
        "argv": words,
    }


def pivot_unmask(data: Any, secrets: Any) -> Any:
    """``data`` with every ``{secret:NAME}`` marker of ``sglang_capabilities`` replaced by the value itself.

    ``secrets``: :func:`pivot_secrets` output of the same unit (its ``values``). Use only under ``no_log``: the
    result holds the secrets in clear (the unit file the pivot writes needs them).
    """
    values = secrets.get("values", {}) if isinstance(secrets, Mapping) else {}
    try:
        return _secrets.unmask(data, values)
    except KeyError as exc:
        raise AnsibleFilterError(
            f"pivot_unmask: the value of the unit's secret {exc.args[0]} was not read back (it is masked as "
            f"{{secret:{exc.args[0]}}}): read the unit's ExecStart, Environment= and EnvironmentFile= files with "
            "pivot_secrets, from the same unit sglang_capabilities read"
        ) from exc


def pivot_mask(data: Any, secrets: Any) -> Any:
    """``data`` (str, list, dict, nested) with every secret value replaced by ``***``.

    ``secrets``: a list of values, or :func:`pivot_secrets` output (its ``secret_values``). Values shorter than 4
    characters are masked only where they are a whole word (a key ``ab`` does not blank every ``ab``).
    """
    values = secrets.get("secret_values", []) if isinstance(secrets, Mapping) else list(secrets or [])
    values = sorted({str(v) for v in values if v not in (None, "")}, key=len, reverse=True)
    if not values:
        return data

    def mask_str(text: str) -> str:
        for value in values:
            if len(value) >= 4:
                text = text.replace(value, MASK)
            else:
                text = re.sub(r"(?<![\w-])" + re.escape(value) + r"(?![\w-])", MASK, text)
        return text

    return _secrets.map_strings(data, mask_str)


def pivot_listen_warning(host: Any, api_key: Any) -> str | None:
    """A warning when the server listens beyond loopback without an API key, else None."""
    h = str(host or "127.0.0.1").strip("[]")
    loopback = h in ("localhost", "::1") or h.startswith("127.")
    if loopback or api_key:
        return None
    return (
        f"the server listens on {h} (not loopback) without --api-key: anyone who can reach it can use it; "
        "add --api-key (and keep the key in an EnvironmentFile= readable only by root) or bind --host 127.0.0.1"
    )


# --------------------------------------------------------------------------------------------------------------
# human units for the report


def pivot_duration(seconds: Any) -> str:
    """``62.5`` -> ``1 min 2.5 s``; ``0.42`` -> ``0.42 s``; ``3725`` -> ``1 h 2 min 5 s``; None -> ``n/a``."""
    value = _num(seconds)
    if value is None:
        return "n/a"
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value < 60:
        text = f"{value:.2f}".rstrip("0").rstrip(".") if value < 10 else f"{value:.1f}".rstrip("0").rstrip(".")
        return f"{sign}{text} s"
    if value >= 3600:
        total = round(value)
        hours, rest = divmod(total, 3600)
        return f"{sign}{hours} h {rest // 60} min {rest % 60} s"
    value = round(value, 1)
    minutes = int(value // 60)
    secs = f"{value - 60 * minutes:.1f}".rstrip("0").rstrip(".")
    return f"{sign}{minutes} min {secs} s"


def pivot_si(value: Any, unit: str = "") -> str:
    """``19500`` -> ``19.5K``; ``1234567`` -> ``1.23M``; ``812.4`` -> ``812``; with ``unit`` appended after a space;
    None -> ``n/a``."""
    number = _num(value)
    if number is None:
        return "n/a"
    text, suffix = (f"{number:.3g}" if abs(number) < 100 else f"{number:.0f}"), ""
    for size, name in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(number) >= size:
            text, suffix = f"{number / size:.3g}", name
            break
    return f"{text}{suffix}" + (f" {unit}" if unit else "")


def pivot_seconds_between(start: Any, end: Any) -> float | None:
    """Seconds from one ISO 8601 time to another (``...Z`` or with an offset); None when either is missing."""
    import datetime

    def parse(text: Any):
        if not text:
            return None
        try:
            value = datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
        except ValueError:
            return None
        return value if value.tzinfo else value.replace(tzinfo=datetime.timezone.utc)

    a, b = parse(start), parse(end)
    return None if a is None or b is None else round((b - a).total_seconds(), 3)


# Every duration the pivot report prints beside two times, and the two times it is the difference of: (where in
# the report, the duration's key, its start's key, its end's key, what it measures, how far apart the figures may
# be from rounding alone). The Markdown prints each with these endpoints; pivot_report_disagreements checks them.
REPORT_SPANS: tuple[tuple[str, str, str, str, str, float], ...] = (
    ("", "wall_time_s", "started_at", "finished_at", "the run, start to end (controller clock)", 0.051),
    ("training[].halt", "elapsed_s", "signalled_at", "ended_at",
     "the halt: first signal to every process gone (host clock)", 0.0015),
    ("inference[].service", "downtime_s", "stop_began_at", "first_healthy_at",
     "downtime: the old server's SIGTERM to the new server's first /health 200 (host clock)", 0.0015),
    ("inference[].service", "stop_s", "stop_began_at", "stop_ended_at",
     "the old server's stop: SIGTERM to gone (host clock)", 0.0015),
    ("inference[].service", "start_to_healthy_s", "start_began_at", "first_healthy_at",
     "the new server's own start to its first /health 200 (host clock)", 0.0015),
    ("inference[].service", "downtime_upper_s", "stopped_at", "healthy_at",
     "just before the restart to the health wait's result (controller clock)", 0.006),
    ("inference[].service.rollback", "outage_s", "outage_from", "finished_at",
     "the whole outage: just before the restart to the restored server healthy (controller clock)", 0.006),
)


def _report_records(report: Mapping[str, Any], where: str) -> list[tuple[str, Mapping[str, Any]]]:
    """(label, record) for each record at ``where`` ("" the report; "training[].halt": each host's halt...)."""
    if not where:
        return [("report", report)]
    found: list[tuple[str, Any]] = [("", report)]
    for part in where.split("."):
        step: list[tuple[str, Any]] = []
        for label, node in found:
            if not isinstance(node, Mapping):
                continue
            if part.endswith("[]"):
                items = node.get(part[:-2]) or []
                for i, item in enumerate(items if isinstance(items, list) else []):
                    host = item.get("host") if isinstance(item, Mapping) else None
                    step.append((f"{label}{part[:-2]}[{host or i}]", item))
            else:
                step.append((f"{label}.{part}", node.get(part)))
        found = step
    return [(label, node) for label, node in found if isinstance(node, Mapping)]


def pivot_report_disagreements(report: Any) -> list[str]:
    """The figures of a pivot report (its JSON) that do not agree, in words; [] when every one does.

    For each duration of REPORT_SPANS that the report holds (a halt that signalled nothing has none): both
    endpoints are there, the end is not before the start, and the duration is the endpoints' difference (within
    rounding). Also: the summary's downtime of each host is that host's service downtime, and every phase ends
    after it starts.
    """
    if not isinstance(report, Mapping):
        return ["the report is not a mapping"]
    problems: list[str] = []
    for where, key, start_key, end_key, what, tolerance in REPORT_SPANS:
        for label, record in _report_records(report, where):
            seconds = _num(record.get(key))
            if seconds is None or (where == "training[].halt" and not record.get("signals_sent")):
                continue  # a halt that signalled nothing (already stopped) has no duration: elapsed_s is 0
            start, end = record.get(start_key), record.get(end_key)
            between = pivot_seconds_between(start, end)
            name = f"{label} {key} = {seconds:g} s ({what})"
            if between is None:
                problems.append(f"{name}: its endpoints {start_key}={start!r}, {end_key}={end!r} are not both times")
            elif between < 0:
                problems.append(f"{name}: {end_key} {end} is before {start_key} {start}")
            elif abs(between - seconds) > tolerance:
                problems.append(f"{name}: but {start_key} {start} and {end_key} {end} are {between:g} s apart")
    for label, phase in (report.get("phases") or {}).items():
        if isinstance(phase, Mapping):
            between = pivot_seconds_between(phase.get("started_at"), phase.get("finished_at"))
            if between is not None and between < 0:
                problems.append(f"phase {label} ends ({phase.get('finished_at')}) before it starts "
                                f"({phase.get('started_at')})")
    services = dict(_report_records(report, "inference[].service"))
    for host, seconds in ((report.get("summary") or {}).get("downtime_s") or {}).items():
        svc = services.get(f"inference[{host}].service")
        if svc is None or _num(svc.get("downtime_s")) != _num(seconds):
            problems.append(f"summary downtime_s of {host} = {seconds} s, but its service says "
                            f"{None if svc is None else svc.get('downtime_s')}")
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "pivot_report_disagreements": pivot_report_disagreements,
            "systemd_unit_parse": systemd_unit_parse,
            "systemd_unit_header": systemd_unit_header,
            "systemd_unit_set_env": systemd_unit_set_env,
            "systemd_unit_env_names": systemd_unit_env_names,
            "systemd_exec_lines": systemd_exec_lines,
            "dflash_drafter_check": dflash_drafter_check,
            "sglang_ddtree_cli": sglang_ddtree_cli,
            "sglang_flag": sglang_flag,
            "generation_compare": generation_compare,
            "pip_freeze_find": pip_freeze_find,
            "pivot_secrets": pivot_secrets,
            "pivot_mask": pivot_mask,
            "pivot_unmask": pivot_unmask,
            "pivot_listen_warning": pivot_listen_warning,
            "pivot_duration": pivot_duration,
            "pivot_si": pivot_si,
            "pivot_seconds_between": pivot_seconds_between,
        }
