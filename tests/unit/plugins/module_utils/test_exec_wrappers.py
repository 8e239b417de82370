"""ExecStart as systemd runs it (issue 16, point 2): wrappers, bare names, and which interpreter that is.

``resolve_exec_program`` is pure: the host's filesystem is a table (executables and existing paths) here.
"""

from __future__ import annotations

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _exec_start, _sglang_flags
from ansible_collections.specdec.pivot.plugins.module_utils import _exec_wrappers as s

SERVE = ["-m", "sglang.launch_server", "--model-path", "/models/m", "--tp-size", "2", "--port", "30000"]
EXE = {
    "/usr/bin/python3",
    "/usr/bin/env",
    "/usr/bin/nice",
    "/usr/bin/ionice",
    "/usr/bin/taskset",
    "/usr/bin/numactl",
    "/usr/bin/chrt",
    "/opt/venv/bin/python",
    "/opt/venv/bin/python3",
    "/opt/x/bin/python",
    "/opt/conda/bin/conda",
    "/opt/conda/condabin/conda",
    "/opt/conda/bin/python",
    "/opt/conda/envs/sglang/bin/python",
    "/srv/envs/sg/bin/python",
    "/usr/local/bin/micromamba",
    "/opt/mamba/envs/sg/bin/python",
    "/usr/local/bin/uv",
    "/srv/app/.venv/bin/python",
    "/usr/local/bin/poetry",
    "/srv/poet/.venv/bin/python",
    "/usr/local/bin/pipenv",
    "/srv/pipe/.venv/bin/python",
}
EXISTS = EXE | {
    "/opt/conda/conda-meta",
    "/opt/conda/envs/sglang/conda-meta",
    "/srv/envs/sg/conda-meta",
    "/opt/mamba/envs/sg/conda-meta",
    "/srv/app/pyproject.toml",
    "/srv/app/.venv/pyvenv.cfg",
    "/srv/poet/pyproject.toml",
    "/srv/poet/.venv/pyvenv.cfg",
    "/srv/nopoet/pyproject.toml",
    "/srv/pipe/Pipfile",
    "/srv/pipe/.venv/pyvenv.cfg",
}
VENV_PATH = {"PATH": "/opt/venv/bin:/usr/bin:/bin"}

# (ExecStart head words, unit environment, WorkingDirectory, interpreter systemd ends up running, wrappers)
RESOLVED = {
    "absolute interpreter": (["/opt/venv/bin/python"], {}, "", "/opt/venv/bin/python", []),
    # systemd's own lookup of a bare first word ignores the unit's Environment=PATH
    "bare python3, Environment=PATH names a venv": (["python3"], VENV_PATH, "", "/usr/bin/python3", []),
    "env python3 uses the unit's PATH": (["/usr/bin/env", "python3"], VENV_PATH, "", "/opt/venv/bin/python3", ["env"]),
    "bare env python3 uses the unit's PATH": (["env", "python3"], VENV_PATH, "", "/opt/venv/bin/python3", ["env"]),
    "env without a unit PATH: systemd's default": (["/usr/bin/env", "python3"], {}, "", "/usr/bin/python3", ["env"]),
    "env VAR=... PATH=...": (
        ["/usr/bin/env", "CUDA_VISIBLE_DEVICES=0,1", "PATH=/opt/x/bin", "python"],
        VENV_PATH,
        "",
        "/opt/x/bin/python",
        ["env"],
    ),
    "nice -n 5 absolute": (
        ["/usr/bin/nice", "-n", "5", "/opt/venv/bin/python"],
        {},
        "",
        "/opt/venv/bin/python",
        ["nice"],
    ),
    "nice -10 bare, unit PATH": (["nice", "-10", "python3"], VENV_PATH, "", "/opt/venv/bin/python3", ["nice"]),
    "nice --adjustment=3": (
        ["nice", "--adjustment=3", "/opt/venv/bin/python"],
        {},
        "",
        "/opt/venv/bin/python",
        ["nice"],
    ),
    "ionice -c 2 -n 0": (
        ["ionice", "-c", "2", "-n", "0", "/opt/venv/bin/python"],
        {},
        "",
        "/opt/venv/bin/python",
        ["ionice"],
    ),
    "taskset -c list": (["taskset", "-c", "0-15", "/opt/venv/bin/python"], {}, "", "/opt/venv/bin/python", ["taskset"]),
    "taskset mask, bare": (
        ["/usr/bin/taskset", "0xff", "python3"],
        VENV_PATH,
        "",
        "/opt/venv/bin/python3",
        ["taskset"],
    ),
    "numactl long options": (
        ["numactl", "--cpunodebind=0", "--membind=0", "/opt/venv/bin/python"],
        {},
        "",
        "/opt/venv/bin/python",
        ["numactl"],
    ),
    "numactl short options": (
        ["numactl", "-N", "0", "-m", "0", "-l", "python3"],
        {},
        "",
        "/usr/bin/python3",
        ["numactl"],
    ),
    "numactl attached values": (
        ["numactl", "-N0", "--interleave", "all", "python3"],
        {},
        "",
        "/usr/bin/python3",
        ["numactl"],
    ),
    "chrt -f 10": (["chrt", "-f", "10", "/opt/venv/bin/python"], {}, "", "/opt/venv/bin/python", ["chrt"]),
    "chrt + nice + taskset + env": (
        ["chrt", "-r", "5", "nice", "-n", "1", "taskset", "-c", "0-7", "env", "OMP_NUM_THREADS=8", "python3"],
        VENV_PATH,
        "",
        "/opt/venv/bin/python3",
        ["chrt", "nice", "taskset", "env"],
    ),
    "conda run -n ENV --no-capture-output": (
        ["/opt/conda/bin/conda", "run", "-n", "sglang", "--no-capture-output", "python"],
        {},
        "",
        "/opt/conda/envs/sglang/bin/python",
        ["conda"],
    ),
    "conda run --name=ENV, condabin": (
        ["/opt/conda/condabin/conda", "run", "--name=sglang", "--live-stream", "python"],
        {},
        "",
        "/opt/conda/envs/sglang/bin/python",
        ["conda"],
    ),
    "conda run -p PREFIX": (
        ["/opt/conda/bin/conda", "run", "-p", "/srv/envs/sg", "python"],
        {},
        "",
        "/srv/envs/sg/bin/python",
        ["conda"],
    ),
    "conda run -n base": (
        ["/opt/conda/bin/conda", "run", "-n", "base", "python"],
        {},
        "",
        "/opt/conda/bin/python",
        ["conda"],
    ),
    "micromamba run with MAMBA_ROOT_PREFIX": (
        ["micromamba", "run", "-n", "sg", "python"],
        {"MAMBA_ROOT_PREFIX": "/opt/mamba"},
        "",
        "/opt/mamba/envs/sg/bin/python",
        ["micromamba"],
    ),
    "micromamba run -r ROOT": (
        ["/usr/local/bin/micromamba", "run", "-r", "/opt/mamba", "-n", "sg", "python"],
        {},
        "",
        "/opt/mamba/envs/sg/bin/python",
        ["micromamba"],
    ),
    "uv run --project": (
        ["/usr/local/bin/uv", "run", "--project", "/srv/app", "--frozen", "python"],
        {},
        "",
        "/srv/app/.venv/bin/python",
        ["uv"],
    ),
    "uv run from a subdirectory of the project": (
        ["uv", "run", "--no-sync", "python"],
        {},
        "/srv/app/sub/dir",
        "/srv/app/.venv/bin/python",
        ["uv"],
    ),
    "poetry run, in-project .venv": (
        ["poetry", "run", "python"],
        {},
        "/srv/poet",
        "/srv/poet/.venv/bin/python",
        ["poetry"],
    ),
    "poetry -C DIR run": (
        ["poetry", "-C", "/srv/poet", "run", "python"],
        {},
        "/",
        "/srv/poet/.venv/bin/python",
        ["poetry"],
    ),
    "pipenv run, in-project .venv": (
        ["pipenv", "run", "python"],
        {},
        "/srv/pipe",
        "/srv/pipe/.venv/bin/python",
        ["pipenv"],
    ),
    "nice + conda run": (
        ["nice", "-n", "5", "/opt/conda/bin/conda", "run", "-n", "sglang", "python"],
        {},
        "",
        "/opt/conda/envs/sglang/bin/python",
        ["nice", "conda"],
    ),
}


def _fs():
    return (lambda p: p in EXE), (lambda p: p in EXISTS)


@pytest.mark.parametrize("case", RESOLVED)
def test_the_interpreter_is_the_one_systemd_and_the_wrappers_run(case):
    head, env, workdir, expected, wrappers = RESOLVED[case]
    parsed = _exec_start.parse_exec_start([*head, *SERVE])
    assert parsed["module"] == "sglang.launch_server" and parsed["flags"]["--tp-size"] == "2"
    assert [w["tool"] for w in parsed["wrappers"]] == wrappers
    got = s.resolve_exec_program(parsed, env, workdir, *_fs())
    assert got["path"] == expected
    assert got["wrappers"] == wrappers


@pytest.mark.parametrize("case", RESOLVED)
def test_wrappers_are_kept_when_the_exec_start_is_rewritten(case):
    head = RESOLVED[case][0]
    parsed = _exec_start.parse_exec_start([*head, *SERVE])
    assert _exec_start.exec_start_argv(parsed) == [*head, *SERVE]
    new = dict(
        parsed, flags=_sglang_flags.replace_speculative_flags(parsed["flags"], {"--speculative-algorithm": "DDTREE"})
    )
    assert _exec_start.exec_start_argv(new)[: len(head)] == head
    again = _exec_start.parse_exec_start(_exec_start.render_exec_start(new, multiline=True))
    assert again["launcher"] == parsed["launcher"] and again["flags"]["--speculative-algorithm"] == "DDTREE"


# (ExecStart head words, unit environment, WorkingDirectory, words the error names)
REFUSED = {
    "bare python3 found only on the unit's PATH": (["python"], VENV_PATH, "", "'python' is not found"),
    "env -i clears PATH": (["/usr/bin/env", "-i", "python3"], VENV_PATH, "", "not found"),
    "conda run, environment missing": (
        ["/opt/conda/bin/conda", "run", "-n", "nope", "python"],
        {},
        "",
        "not a conda environment",
    ),
    "conda without run": (["/opt/conda/bin/conda", "activate", "sglang", "python"], {}, "", "without `run`"),
    "conda run, unknown option": (["/opt/conda/bin/conda", "run", "--frob", "python"], {}, "", "'--frob'"),
    "micromamba run -n without a root prefix": (["micromamba", "run", "-n", "sg", "python"], {}, "", "root prefix"),
    "uv run --with": (["uv", "run", "--with", "x", "python"], {}, "/srv/app", "outside the project"),
    "uv run --isolated": (["uv", "run", "--isolated", "python"], {}, "/srv/app", "outside the project"),
    "uv run without a project dir": (["uv", "run", "python"], {}, "", "project directory is unknown"),
    "poetry run, virtualenv outside the project": (["poetry", "run", "python"], {}, "/srv/nopoet", "cannot locate"),
    "pipenv run without a Pipfile": (["pipenv", "run", "python"], {}, "/srv/app", "finds no project (Pipfile)"),
    "taskset -p (a running process)": (["taskset", "-p", "0xff", "123"], {}, "", "changes a running process"),
    "numactl --show": (["numactl", "--show"], {}, "", "starts no program"),
    "nice with nothing after it": (["nice", "-n", "5"], {}, "", "names no program"),
    "program named through a variable": (["/usr/bin/env", "${PY}"], {}, "", "variable"),
    "interpreter not on this host": (["/opt/gone/bin/python"], {}, "", "not an executable file"),
    "conda run python outside the env": (
        ["/opt/conda/bin/conda", "run", "-n", "sglang", "python3"],
        {},
        "",
        "not found",
    ),
}


WHOLE_COMMAND = {"nice with nothing after it", "taskset -p (a running process)", "numactl --show"}


@pytest.mark.parametrize("case", REFUSED)
def test_an_interpreter_that_cannot_be_told_for_sure_is_refused_with_the_reason(case):
    head, env, workdir, needle = REFUSED[case]
    argv = head if case in WHOLE_COMMAND else [*head, *SERVE]
    with pytest.raises(ValueError, match=None) as err:
        parsed = _exec_start.parse_exec_start(argv)
        s.resolve_exec_program(parsed, env, workdir, *_fs())
    assert needle in str(err.value), str(err.value)


@pytest.mark.parametrize("case", RESOLVED)
def test_the_server_arguments_start_after_every_wrapper(case):
    """What preflight hands to SGLang's own parser: the flags after the program, never a wrapper's flags."""
    head = RESOLVED[case][0]
    parsed = _exec_start.parse_exec_start([*head, *SERVE])
    argv = _exec_start.exec_start_argv(parsed)
    server = argv[len(_exec_start.exec_start_argv({**parsed, "flags": {}, "trailing_args": []})) :]
    assert server == SERVE[2:]
