"""Would SGLang's own parser accept this server command line? Run with the unit's interpreter (read-only).

Usage: check_server_args.py ARGV_B64

ARGV_B64 is base64 of a JSON list: the server's words from the first ``--flag`` on (``python -m
sglang.launch_server`` and positional words such as ``serve`` left out). Does what ``sglang.launch_server`` does
before it builds ServerArgs: ``sglang.srt.plugins.load_plugins()``, ``ServerArgs.add_cli_args`` on an argparse
parser, ``parse_args``; then resolves ``--speculative-algorithm`` with ``SpeculativeAlgorithm.from_string`` when
that name is already registered here (before the plugin is installed DDTREE is not, and that is checked after the
install instead). Nothing starts, no model is read, no GPU is touched.

Prints one JSON object: checked (false when SGLang's parser cannot be imported here: reason), ok, error,
algorithm, algorithm_resolved. Exit 0 either way; the caller decides.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import sys


class ParseError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit 2
        raise ParseError(message)


def main(argv: list[str]) -> int:
    words = [str(w) for w in json.loads(base64.b64decode(argv[1]))]
    out = {"checked": False, "ok": None, "error": "", "reason": "", "algorithm": None, "algorithm_resolved": None}
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            try:
                from sglang.srt.plugins import load_plugins

                load_plugins()
            except ImportError:
                pass  # an SGLang without the plugin API: the parser still decides about the flags
            from sglang.srt.server_args import ServerArgs
    except Exception as exc:  # any import failure: say so, do not guess
        out["reason"] = f"cannot import SGLang's server args here ({type(exc).__name__}: {exc})"
        print(json.dumps(out))
        return 0
    out["checked"] = True
    parser = Parser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            args = parser.parse_args(words)
    except ParseError as exc:
        out.update(ok=False, error=str(exc))
        print(json.dumps(out))
        return 0
    algorithm = getattr(args, "speculative_algorithm", None)
    out.update(ok=True, algorithm=algorithm)
    if algorithm:
        try:
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

            resolved = SpeculativeAlgorithm.from_string(algorithm)
            out["algorithm_resolved"] = str(getattr(resolved, "name", resolved))
        except Exception as exc:  # not registered (yet): reported, not decided here
            out["algorithm_resolved"] = None
            out["reason"] = f"--speculative-algorithm {algorithm} does not resolve here yet ({exc})"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
