# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The programs an ExecStart may run in front of the interpreter, and which executable it finally runs.

- ``parse_wrappers`` reads the chain of wrappers (``env``, ``nice``, ``ionice``, ``taskset``, ``numactl``, ``chrt``,
  ``conda``/``mamba``/``micromamba``/``uv``/``poetry``/``pipenv`` ``run``) before the program; it refuses an option
  it does not know rather than guessing.
- ``resolve_exec_program`` finds the executable as systemd (``SYSTEMD_DEFAULT_PATH``) and each wrapper find it; the
  host's filesystem comes in as two functions, so it is tested with tables
  (tests/unit/plugins/module_utils/test_exec_wrappers.py).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.specdec.pivot.plugins.module_utils._argv_flags import _NEGATIVE_NUMBER_RE

#: PATH systemd gives services that set none (systemd.exec(5), "Environment variables in spawned
#: processes").
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ENV_OPTS_WITH_ARG = ("-u", "--unset", "-C", "--chdir", "-S", "--split-string")

# Programs an ExecStart may run in front of the interpreter; each starts the rest of the command line.
#: Options (of the wrapper) that take the next word as their value.
_WRAPPER_VALUE_OPTS: dict[str, frozenset] = {
    "env": frozenset({"-u", "--unset", "-C", "--chdir"}),
    "nice": frozenset({"-n", "--adjustment"}),
    "ionice": frozenset({"-c", "--class", "-n", "--classdata"}),
    "taskset": frozenset(),
    "numactl": frozenset(
        {
            "-N",
            "--cpunodebind",
            "-m",
            "--membind",
            "-i",
            "--interleave",
            "-C",
            "--physcpubind",
            "-p",
            "--preferred",
            "-w",
            "--weighted-interleave",
            "-P",
            "--preferred-many",
        }
    ),
    "chrt": frozenset({"-T", "--sched-runtime", "-P", "--sched-period", "-D", "--sched-deadline"}),
    "conda": frozenset({"-n", "--name", "-p", "--prefix", "--cwd"}),
    "micromamba": frozenset({"-n", "--name", "-p", "--prefix", "--cwd", "-r", "--root-prefix", "-a", "--attach"}),
    "uv": frozenset(
        {
            "--project",
            "--directory",
            "--python",
            "-p",
            "--env-file",
            "--extra",
            "--group",
            "--package",
            "--index-url",
            "--extra-index-url",
            "--index",
            "--default-index",
            "--cache-dir",
            "--config-file",
        }
    ),
    "poetry": frozenset({"-C", "--directory", "-P", "--project"}),
    "pipenv": frozenset({"--python", "--site-packages"}),
}
#: Flags (no value) each wrapper accepts before the program; any other option is refused (not guessed).
_WRAPPER_FLAGS: dict[str, frozenset] = {
    "env": frozenset({"-i", "--ignore-environment", "-0", "--null", "-", "--debug", "-v"}),
    "nice": frozenset(),
    "ionice": frozenset({"-t", "--ignore"}),
    "taskset": frozenset({"-a", "--all-tasks", "-c", "--cpu-list"}),
    "numactl": frozenset(
        {"-l", "--localalloc", "-a", "--all", "-b", "--balancing", "--huge", "--touch", "--strict", "-t", "--offset"}
    ),
    "chrt": frozenset(
        {
            "-f",
            "--fifo",
            "-r",
            "--rr",
            "-o",
            "--other",
            "-b",
            "--batch",
            "-i",
            "--idle",
            "-d",
            "--deadline",
            "-R",
            "--reset-on-fork",
            "-a",
            "--all-tasks",
            "-v",
            "--verbose",
        }
    ),
    "conda": frozenset(
        {"--no-capture-output", "--live-stream", "-v", "--verbose", "--debug-wrapper-scripts", "--dev", "-q", "--quiet"}
    ),
    "micromamba": frozenset({"--clean-env", "-q", "--quiet", "-v", "--verbose", "-y", "--yes"}),
    "uv": frozenset(
        {
            "--frozen",
            "--locked",
            "--no-sync",
            "--offline",
            "-q",
            "--quiet",
            "-v",
            "--verbose",
            "--no-dev",
            "--all-extras",
            "--no-env-file",
            "--exact",
            "--inexact",
            "--native-tls",
            "--no-progress",
            "--compile-bytecode",
            "--all-groups",
            "--no-config",
        }
    ),
    "poetry": frozenset(
        {
            "-q",
            "--quiet",
            "-n",
            "--no-interaction",
            "--no-ansi",
            "--ansi",
            "-v",
            "-vv",
            "-vvv",
            "--no-plugins",
            "--no-cache",
        }
    ),
    "pipenv": frozenset({"-q", "--quiet", "-v", "--verbose", "--system"}),
}
#: uv run options that make it run something other than the project's environment: refused.
_UV_OTHER_ENV = frozenset(
    {
        "--with",
        "--with-requirements",
        "--with-editable",
        "--isolated",
        "--no-project",
        "--active",
        "--script",
        "--gui-script",
        "--module",
        "-m",
        "-s",
    }
)
_ENV_MANAGERS = {
    "conda": "conda",
    "mamba": "conda",
    "micromamba": "micromamba",
    "uv": "uv",
    "poetry": "poetry",
    "pipenv": "pipenv",
}
_PLAIN_WRAPPERS = ("env", "nice", "ionice", "taskset", "numactl", "chrt")
_SUBCOMMAND_RUN = ("conda", "micromamba", "uv", "poetry", "pipenv")


def _wrapper_tool(word: str) -> str | None:
    name = word.rsplit("/", 1)[-1]
    if name in _PLAIN_WRAPPERS:
        return name
    return _ENV_MANAGERS.get(name)


def _parse_wrapper(argv: list[str], i: int) -> tuple[dict[str, Any], int]:
    """The wrapper at ``argv[i]`` (env, nice, ionice, taskset, numactl, chrt, conda/mamba/micromamba/uv/poetry/pipenv
    ``run``): ``({"tool", "program", "words", "options", "env_assignments"}, index of the wrapped program)``.

    Raises ValueError naming the word and the fix when the wrapper is used in a way that runs no program (``-p``
    modes, no ``run``), or with an option this parser does not know (it refuses rather than guessing).
    """
    word = argv[i]
    tool = _wrapper_tool(word)
    start = i
    i += 1
    global_opts: dict[str, Any] = {}
    if tool in _SUBCOMMAND_RUN:
        # global options of pipenv/poetry/uv may come before "run"
        while i < len(argv) and argv[i] != "run" and argv[i].startswith("-"):
            name, eq, val = argv[i].partition("=")
            if name in _WRAPPER_VALUE_OPTS[tool] and not eq:
                global_opts[name] = argv[i + 1] if i + 1 < len(argv) else ""
                i += 2
            else:
                global_opts[name] = val if eq else True
                i += 1
        if i >= len(argv) or argv[i] != "run":
            raise ValueError(f"{word} without `run` does not start a program")
        i += 1
    options: dict[str, Any] = dict(global_opts)
    assignments: dict[str, str] = {}
    values, flags = _WRAPPER_VALUE_OPTS[tool], _WRAPPER_FLAGS[tool]
    positional_left = {"taskset": 1, "chrt": 1}.get(tool, 0)  # taskset MASK, chrt PRIORITY
    while i < len(argv):
        w = argv[i]
        if w == "--" and tool not in ("env",):
            i += 1
            break
        if tool == "env" and "=" in w and not w.startswith("-"):
            k, v = w.split("=", 1)
            assignments[k] = v
            i += 1
            continue
        if w.startswith("-") and w != "-" and not (tool == "nice" and _NEGATIVE_NUMBER_RE.match(w)):
            name, eq, val = w.partition("=")
            if tool == "uv" and name in _UV_OTHER_ENV:
                raise ValueError(f"`uv run {name}` runs outside the project's environment")
            if name in ("-p", "--pid", "-P", "--pgrp", "-u", "--uid") and tool in ("taskset", "chrt", "ionice"):
                if not (tool == "chrt" and name == "-P"):
                    raise ValueError(f"{word} {name} changes a running process; it starts no program")
            if name in ("-s", "--show", "-H", "--hardware") and tool == "numactl":
                raise ValueError(f"{word} {name} starts no program")
            if name in values:
                if eq:
                    options[name] = val
                    i += 1
                elif i + 1 < len(argv):
                    options[name] = argv[i + 1]
                    i += 2
                else:
                    raise ValueError(f"{word} option {name} has no value")
                continue
            if len(name) > 2 and not name.startswith("--") and name[:2] in values:  # -n10, -N0, -nENV
                options[name[:2]] = name[2:]
                i += 1
                continue
            if name in flags:
                options[name] = True
                i += 1
                continue
            raise ValueError(
                f"{word}'s option {w!r} is not one this module reads; it cannot tell which program the unit runs"
            )
        if tool == "nice" and _NEGATIVE_NUMBER_RE.match(w):  # nice -10 cmd
            options["-n"] = w[1:]
            i += 1
            continue
        if positional_left:
            options["_" + ("mask" if tool == "taskset" else "priority")] = w
            positional_left -= 1
            i += 1
            continue
        break
    if i >= len(argv):
        raise ValueError(f"{word} names no program to run after it")
    return (
        {"tool": tool, "program": word, "words": argv[start:i], "options": options, "env_assignments": assignments},
        i,
    )


def parse_wrappers(argv: list[str]) -> tuple[list[dict[str, Any]], int]:
    """The chain of wrappers before the program (``nice -n 5 env A=1 conda run -n sg python ...``), and the
    index of the program they finally run. See :func:`_parse_wrapper`."""
    wrappers: list[dict[str, Any]] = []
    i = 0
    while i < len(argv) and _wrapper_tool(argv[i]) and len(wrappers) < 8:
        wrapper, i = _parse_wrapper(argv, i)
        wrappers.append(wrapper)
    return wrappers, i


def _search(name: str, path_var: str, is_executable) -> str | None:
    for d in (path_var or "").split(":"):
        if d and is_executable(d.rstrip("/") + "/" + name):
            return d.rstrip("/") + "/" + name
    return None


def _project_root(start: str, markers: tuple[str, ...], exists) -> str | None:
    d = start.rstrip("/") or "/"
    while True:
        if any(exists(f"{d.rstrip('/')}/{m}") for m in markers):
            return d
        if d == "/":
            return None
        d = d.rsplit("/", 1)[0] or "/"


def resolve_exec_program(
    parsed: dict[str, Any], unit_env: dict[str, str], working_directory: str, is_executable, exists
) -> dict[str, Any]:
    """Which executable the unit's ExecStart finally runs, found as systemd and each wrapper find it.

    - The first word, when it is a bare name, is looked up in systemd's fixed search path
      (:data:`SYSTEMD_DEFAULT_PATH`); a unit's ``Environment=PATH`` does NOT change that lookup.
    - A program started by ``env``, ``nice``, ``ionice``, ``taskset``, ``numactl`` or ``chrt`` is looked up in
      the service's PATH (``Environment=``/``EnvironmentFile=`` PATH, else systemd's default), with ``env``'s
      own ``PATH=`` assignment applied.
    - ``conda``/``mamba``/``micromamba run -n ENV|-p PREFIX`` run it in that environment (its ``bin/``); ``uv run``,
      ``poetry run`` and ``pipenv run`` in the project's in-project ``.venv`` (project: ``--project``/
      ``--directory``/``-C``, else WorkingDirectory, walking up to ``pyproject.toml``/``Pipfile``).
    ``is_executable(path)`` and ``exists(path)`` look at the host's filesystem (tables in tests).
    Returns ``{"path", "how", "wrappers", "env_prefix"}``; raises ValueError naming the reason and the fix.
    """
    wrappers = parsed.get("wrappers") or []
    service_path = unit_env.get("PATH") or SYSTEMD_DEFAULT_PATH
    path_var = SYSTEMD_DEFAULT_PATH  # systemd's own lookup of the first word
    how = "systemd's search path"
    env_prefix = None

    def find(word: str, where: str, what: str) -> str:
        if any(c in word for c in "$%"):
            raise ValueError(f"{what} {word!r} uses a variable or specifier this module does not expand")
        if "/" in word:
            if not is_executable(word):
                raise ValueError(f"{what} {word} is not an executable file on this host")
            return word
        found = _search(word, where, is_executable)
        if not found:
            raise ValueError(f"{what} {word!r} is not found in {where} ({how})")
        return found

    for wrapper in wrappers:
        program = find(wrapper["program"], path_var, "the wrapper")
        tool, opts = wrapper["tool"], wrapper["options"]
        if tool == "env":
            path_var = wrapper["env_assignments"].get(
                "PATH", service_path if not opts.get("-i") and not opts.get("--ignore-environment") else ""
            )
            how = "env's PATH (the unit's Environment=PATH or systemd's default)"
            if "$" in path_var:
                raise ValueError(f"env's PATH={path_var!r} uses a variable this module does not expand")
        elif tool in ("conda", "micromamba"):
            prefix = opts.get("-p") or opts.get("--prefix")
            name = opts.get("-n") or opts.get("--name")
            if not prefix:
                if tool == "conda":
                    root = program.rsplit("/", 2)[0]  # ROOT/bin/conda or ROOT/condabin/conda
                else:
                    root = opts.get("-r") or opts.get("--root-prefix") or unit_env.get("MAMBA_ROOT_PREFIX")
                    if not root:
                        raise ValueError(
                            "micromamba run -n names an environment under a root prefix that the unit does not set "
                            "(-r/--root-prefix or MAMBA_ROOT_PREFIX)"
                        )
                prefix = root if (not name or name == "base") else f"{root}/envs/{name}"
            if not exists(f"{prefix}/conda-meta"):
                raise ValueError(f"{tool} run's environment {prefix} is not a conda environment on this host")
            env_prefix, path_var, how = prefix, f"{prefix}/bin", f"the {tool} environment {prefix}"
        elif tool in ("uv", "poetry", "pipenv"):
            start = (
                opts.get("--project")
                or opts.get("--directory")
                or opts.get("-C")
                or opts.get("-P")
                or working_directory
                or ""
            )
            if not start.startswith("/"):
                raise ValueError(
                    f"{tool} run's project directory is unknown (no WorkingDirectory= or absolute "
                    f"--project/--directory)"
                )
            markers = ("Pipfile",) if tool == "pipenv" else ("pyproject.toml",)
            root = _project_root(start, markers, exists)
            if root is None:
                raise ValueError(f"{tool} run finds no project ({markers[0]}) in {start} or above it")
            venv = unit_env.get("UV_PROJECT_ENVIRONMENT") if tool == "uv" else None
            venv = venv if venv and venv.startswith("/") else f"{root}/{venv or '.venv'}"
            if not exists(f"{venv}/pyvenv.cfg"):
                raise ValueError(
                    f"{tool} run uses a virtualenv this module cannot locate ({venv} is not one; "
                    f"{tool} may keep it elsewhere)"
                )
            env_prefix, path_var, how = venv, f"{venv}/bin", f"the {tool} project environment {venv}"
        else:
            path_var, how = service_path, f"{tool}'s PATH (the unit's Environment=PATH or systemd's default)"
    program = parsed["program"]
    word = parsed["path"] if ("@" in parsed.get("prefix", "") and not wrappers) else program
    found = find(word, path_var, "the program")
    if env_prefix and "/" not in word and not found.startswith(env_prefix + "/"):
        raise ValueError(f"the program {word!r} is not in {env_prefix}/bin")
    return {"path": found, "how": how, "wrappers": [w["tool"] for w in wrappers], "env_prefix": env_prefix}
