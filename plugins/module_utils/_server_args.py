# Private module_utils for specdec.pivot: a server command line checked with SGLang's own argument parser.
"""Would SGLang's own parser accept this server command line? Run in the SGLang interpreter (read-only).

:func:`check_server_args` does what ``sglang.launch_server`` does before it builds ServerArgs:
``sglang.srt.plugins.load_plugins()``, ``ServerArgs.add_cli_args`` on an argparse parser, ``parse_args``; then
resolves ``--speculative-algorithm`` with ``SpeculativeAlgorithm.from_string`` when that name is registered
(before the plugin is installed DDTREE is not; that is checked after the install instead). When it resolves to
DDTREE, it then runs sglang-ddtree's own start-up check (``handle_ddtree_server_args``, what a DDTREE server runs on
its ServerArgs before it loads anything: drafter, budget, attention backends, page size, parallelism) on a copy of
the parsed arguments, so a server that would refuse to start is caught before anything is stopped. Nothing starts,
no weights are read (the target's and the drafter's config.json are), no GPU is touched. SGLang is reached
through :class:`SGLangHooks` so the decisions are tested with a stand-in parser as well as with the real SGLang.
Keeps to Python 3.8 (it runs in the unit's interpreter).

The module does not import SGLang in its own process: AnsibleModule (ansible-core 2.19) replaces ``sys.intern``
with an object torch's dynamo refuses (``substitute_in_graph expects a function``), so ``import sglang`` fails
there. It runs this file's source as ``<its own interpreter> -c SOURCE`` (:func:`child_source`) with the words as
JSON on its stdin (never on its command line, which every user can read in /proc: the words hold the server's
keys), a clean process of the same interpreter with the same environment, which prints one line ``MARKER{json}``
(:func:`main`); the module reads it back with ``_sglang_probe.parse_probe_output(stdout, MARKER)`` (the
same reader as the capabilities probe's; not imported here: this source runs where the collection is not).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import sys

#: The line prefix of the verdict on the child's stdout.
MARKER = "SPECDEC_SERVER_ARGS_JSON:"


class ParseError(Exception):
    pass


class Refused(Exception):
    """A start-up check's refusal; its message names the option and the fix."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing the usage and exiting 2."""

    def error(self, message: str):
        raise ParseError(message)


class SGLangHooks:
    """The four things taken from SGLang and its DDTREE plugin; each may raise (ImportError or anything else)."""

    def load_plugins(self) -> None:
        try:
            from sglang.srt.plugins import load_plugins
        except ImportError:
            return  # an SGLang without the plugin API: the parser still decides about the flags
        load_plugins()

    def server_args_class(self):
        from sglang.srt.server_args import ServerArgs

        return ServerArgs

    def resolve_algorithm(self, name: str) -> str:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        resolved = SpeculativeAlgorithm.from_string(name)
        return str(getattr(resolved, "name", resolved))

    def ddtree_startup_check(self, args: argparse.Namespace) -> None:
        """sglang-ddtree's start-up check on ``args`` (changes them, as it completes a server's args); raises
        :class:`Refused` with its message (anything else: the check did not run)."""
        from sglang_ddtree.sglang.server_args import DDTreeConfigError, handle_ddtree_server_args

        try:
            handle_ddtree_server_args(args)
        except DDTreeConfigError as exc:
            raise Refused(str(exc)) from None


def ddtree_startup_check(args: argparse.Namespace, hooks: SGLangHooks) -> dict:
    """The verdict of sglang-ddtree's start-up check on the parsed words: ``checked``, ``ok`` (None when not
    checked), ``error`` (the plugin's refusal), ``reason`` (why it was not decided here).

    It reads the target's and the drafter's config.json, so it runs only when both paths are directories on this
    host (a hub id is fetched by the server itself at start: the server runs the same check then). ``--device``
    unset is taken as cuda, SGLang's choice on a host with an NVIDIA GPU (preflight's GPU check sees to that)."""
    out = {"checked": False, "ok": None, "error": "", "reason": ""}
    for flag, value in (("--model-path", getattr(args, "model_path", None)),
                        ("--speculative-draft-model-path", getattr(args, "speculative_draft_model_path", None))):
        if value is not None and not os.path.isdir(str(value)):
            out["reason"] = (f"{flag} {value} is not a directory on this host (a hub id is fetched by the server at "
                             "start, which runs this check then)")
            return out
    candidate = copy.copy(args)
    if not getattr(candidate, "device", None):
        candidate.device = "cuda"
    try:
        hooks.ddtree_startup_check(candidate)
    except Refused as exc:
        out.update(checked=True, ok=False, error=" ".join(str(exc).split()))
    except Exception as exc:  # not importable or broken here (an older plugin, a partial SGLang): say so, not guess
        out["reason"] = f"the check did not run here ({type(exc).__name__}: {' '.join(str(exc).split())})"
    else:
        out.update(checked=True, ok=True)
    return out


#: Abbreviations the pivot reads as SGLang does (``sglang_flag``'s aliases): not reported by :func:`abbreviations`.
#: ``--tp`` is how SGLang's own documentation writes ``--tp-size``.
READ_ABBREVIATIONS = frozenset({"--tp"})


def abbreviations(words: list[str], option_strings) -> dict:
    """``{word: option}`` for each flag in ``words`` that is not one of ``option_strings`` but a prefix of exactly one
    of them: argparse (``allow_abbrev``, SGLang's parser) expands ``--max-running 8`` to ``--max-running-requests 8``,
    while the pivot reads a flag by its full name. Words after ``--`` and values are not flags; ``--flag=value``
    counts as ``--flag``; :data:`READ_ABBREVIATIONS` are left out."""
    options = sorted(str(o) for o in option_strings)
    found = {}
    for word in words:
        if word == "--":
            break
        if not word.startswith("--"):
            continue
        name = word.split("=", 1)[0]
        if name in options or name in READ_ABBREVIATIONS:
            continue
        matches = [o for o in options if o.startswith(name)]
        if len(matches) == 1:
            found[name] = matches[0]
    return found


def unchecked(reason: str = "") -> dict:
    """A verdict of :func:`check_server_args` with nothing decided (SGLang's parser was not asked: ``reason``)."""
    return {"checked": False, "ok": None, "error": "", "reason": reason, "algorithm": None, "algorithm_resolved": None,
            "startup_check": None, "abbreviations": {}}


def check_server_args(words: list[str], hooks: SGLangHooks | None = None) -> dict:
    """The verdict on ``words`` (the server's words from the first ``--flag`` on).

    Keys: ``checked`` (false when SGLang's parser cannot be imported here; ``reason`` says why), ``ok`` (None when
    not checked), ``error`` (argparse's message when refused), ``reason``, ``algorithm`` (the parsed
    ``--speculative-algorithm``), ``algorithm_resolved`` (its registered name, or None with ``reason``),
    ``startup_check`` (DDTREE only, else None: :func:`ddtree_startup_check`'s verdict; a refusal there makes ``ok``
    false with the plugin's message as ``error``), ``abbreviations`` (:func:`abbreviations` of the parsed words: SGLang
    accepts them, the role refuses them). What SGLang prints while importing and parsing is swallowed; the
    caller's stdout stays clean.
    """
    hooks = hooks or SGLangHooks()
    words = [str(w) for w in words]
    out = unchecked()
    noise = io.StringIO()
    with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
        try:
            hooks.load_plugins()
            server_args = hooks.server_args_class()
        except Exception as exc:  # any import failure: say so, do not guess
            out["reason"] = f"cannot import SGLang's server args here ({type(exc).__name__}: {exc})"
            return out
        out["checked"] = True
        parser = Parser(prog="sglang.launch_server", add_help=False)
        server_args.add_cli_args(parser)
        try:
            args = parser.parse_args(words)
        except ParseError as exc:
            out.update(ok=False, error=str(exc))
            return out
        algorithm = getattr(args, "speculative_algorithm", None)
        out.update(ok=True, algorithm=algorithm, abbreviations=abbreviations(words, parser._option_string_actions))
        if algorithm:
            try:
                out["algorithm_resolved"] = hooks.resolve_algorithm(algorithm)
            except Exception as exc:  # not registered (yet): reported, not decided here
                out["reason"] = f"--speculative-algorithm {algorithm} does not resolve here yet ({exc})"
        if str(out["algorithm_resolved"] or "").upper() == "DDTREE":
            check = ddtree_startup_check(args, hooks)
            out["startup_check"] = check
            if check["ok"] is False:
                out.update(ok=False, error=f"sglang-ddtree's start-up check refuses it: {check['error']}")
    return out


def main(argv: list[str]) -> int:
    """``-c SOURCE`` with the words' JSON on stdin: print ``MARKER{verdict}`` on its own line; exit 0 whatever the
    verdict."""
    words = json.loads(sys.stdin.read())
    verdict = check_server_args(words)
    sys.stdout.write("\n" + MARKER + json.dumps(verdict) + "\n")
    sys.stdout.flush()
    return 0


def child_source() -> str:
    """This file's source plus the call of :func:`main`, for ``python -c`` (from a zip too, as AnsiballZ ships it)."""
    spec = globals().get("__spec__")
    loader = getattr(spec, "loader", None) or globals().get("__loader__")
    source = loader.get_source(__name__) if loader is not None else None
    if source is None:
        with open(__file__, encoding="utf-8") as f:
            source = f.read()
    return source + "\n\nif __name__ == '__main__':\n    sys.exit(main(sys.argv))\n"
