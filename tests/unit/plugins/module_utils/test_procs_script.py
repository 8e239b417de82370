"""Which processes execute the training script and which only name it (issue 16, point 1): tables."""

from __future__ import annotations

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _procs
from ansible_collections.specdec.pivot.plugins.module_utils._procs import ProcInfo

S = "train_dflash_pipeline.py"
P = "/opt/train/train_dflash_pipeline.py"

# (argv, executes S) - every shape of "runs it" and of "only names it".
RUNS = [
    ["python", P],
    ["python3", P, "--nproc-per-node", "2"],
    ["python3.11", S],
    ["/usr/bin/python3.12", "-u", P],
    ["/opt/conda/envs/train/bin/python", "-u", "-B", P, "--lr", "1e-4"],
    ["python3", "-uB", P],
    ["python3", "-W", "ignore", P],
    ["python3", "-Wignore::DeprecationWarning", P],
    ["python3", "-X", "faulthandler", "-X", "dev", P],
    ["python3", "--check-hash-based-pycs", "never", P],
    ["python3", "--", P],
    ["pypy3", P],
    ["python3d", P],
    ["torchrun", "--nproc-per-node", "8", P, "--config", "a.yaml"],
    ["torchrun", "--nproc_per_node=8", "--standalone", P],
    ["torchrun", "--standalone", "--nnodes", "1", "--nproc-per-node", "8", S],
    ["torchrun", "--rdzv-backend", "c10d", "--rdzv-endpoint", "host:29400", P],
    ["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node", "2", P],
    ["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", P],
    ["python3", "-u", "-m", "torch.distributed.run", "--nproc_per_node=2", P, "--resume"],
    ["python3", "-mtorch.distributed.run", "--standalone", P],
    ["python", "-m", "torch.distributed.launch", "--use_env", "--nproc_per_node", "2", P],
    ["accelerate", "launch", "--num_processes", "2", "--multi_gpu", P],
    ["accelerate", "launch", "--config_file", "cfg.yaml", P, "--epochs", "3"],
    ["/home/u/.local/bin/accelerate", "launch", "--mixed_precision", "bf16", P],
    ["python", "-m", "accelerate.commands.launch", "--num_processes=2", P],
    ["python", "-m", "accelerate.commands.accelerate_cli", "launch", P],
    ["deepspeed", "--num_gpus", "8", P, "--deepspeed_config", "ds.json"],
    ["deepspeed", "--hostfile", "hosts", "--no_local_rank", P],
    ["python3", "-m", "deepspeed.launcher.runner", "--num_gpus=2", P],
    ["torchrun", "--no-python", "python3", "-u", P],
    ["deepspeed", "--no_python", "python3", P],
    ["torchrun", "--nproc-per-node", "2", "--", P],
]
NAMES_ONLY = [
    ["less", P],
    ["less", "+F", "/opt/train/logs/train.log", P],
    ["more", P],
    ["view", P],
    ["vi", P],
    ["vim", "-O", P, "other.py"],
    ["nvim", P],
    ["nano", P],
    ["emacs", "-nw", P],
    ["grep", "-n", "lr", P],
    ["grep", "-r", S, "/opt/train"],
    ["tail", "-f", P],
    ["tail", "-F", "/opt/train/logs/train.log", P],
    ["head", "-50", P],
    ["cat", P],
    ["watch", "-n", "1", f"pgrep -af {S}"],
    ["watch", "-n1", "nvidia-smi", ";", "python3", P],
    ["ssh", "ct200", "python3", P],
    ["ssh", "-t", "trainer@ct200", f"cd /opt/train && python3 {S}"],
    ["scp", P, "host:/tmp/"],
    ["rsync", "-a", P, "host:/tmp/"],
    ["bash", "-c", f"python3 {P}"],  # the shell is not the run (the python it starts is)
    ["sh", "-c", f"tail -f {P}"],
    ["sudo", "-u", "trainer", "python3", P],  # sudo's own process; the python it starts is the run
    ["timeout", "3h", "python3", P],
    ["nohup", "python3", P],  # an exec'd nohup has python's argv; a nohup process itself runs nothing
    ["python3", "-c", "import time; time.sleep(60)", P],
    ["python3", "-c", f"exec(open('{P}').read())"],
    ["python3", "-cprint(1)", P],
    ["python3", "/opt/tools/inspect_ckpt.py", P],
    ["python3", "-m", "pydoc", S],
    ["python3", "-m", "py_compile", P],
    ["python3", "-m", "pdb", "-c", "continue", "other.py", P],
    ["python3", "-", P],
    ["python3"],
    ["torchrun", "--nproc-per-node", "2", "other.py", P],
    ["torchrun", "-m", "train_dflash_pipeline", "--x", P],
    ["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "other.py", "--config", P],
    ["accelerate", "config", P],
    ["accelerate", "env"],
    ["deepspeed", "--num_gpus", "2", "eval.py", P],
    ["git", "log", "--", P],
    ["py-spy", "dump", "--pid", "4100", P],
    ["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node", "2", "other.py", S],
    ["python3", "train_dflash_pipeline.py.bak"],
    ["python3", "/opt/train/train_dflash_pipeline.pyc"],
    ["python3", "/opt/train/old_train_dflash_pipeline.py"],
    [],
]


@pytest.mark.parametrize("argv", RUNS, ids=[" ".join(a)[:70] for a in RUNS])
def test_interpreters_and_launchers_that_run_the_script_execute_it(argv):
    assert _procs.executes_script(argv, S)


@pytest.mark.parametrize("argv", RUNS, ids=[" ".join(a)[:70] for a in RUNS])
def test_the_same_runs_match_the_script_given_as_a_path(argv):
    cwd = "/opt/train"
    assert _procs.executes_script(argv, P, cwd)


@pytest.mark.parametrize("argv", NAMES_ONLY, ids=[" ".join(a)[:70] or "empty" for a in NAMES_ONLY])
def test_processes_that_only_name_the_script_never_execute_it(argv):
    assert not _procs.executes_script(argv, S)
    assert not _procs.executes_script(argv, P, "/opt/train")


@pytest.mark.parametrize(
    ("arg", "script", "cwd", "expected"),
    [
        (P, S, None, True),
        ("train_dflash_pipeline.py", S, None, True),
        ("./train_dflash_pipeline.py", S, "/tmp", True),
        ("/srv/other/train_dflash_pipeline.py", S, None, True),  # a bare name matches in any directory
        ("/srv/other/train_dflash_pipeline.py", P, None, False),  # a path matches that path only
        ("train_dflash_pipeline.py", P, "/opt/train", True),
        ("../train/train_dflash_pipeline.py", P, "/opt/x", True),
        ("train_dflash_pipeline.py", P, "/srv", False),
        ("/opt/train/./train_dflash_pipeline.py", P, None, True),
        ("train_dflash_pipeline.py", P, None, False),  # relative, cwd unknown: not provably this path
        ("sub/train_dflash_pipeline.py", "sub/train_dflash_pipeline.py", None, True),
        ("", S, None, False),
        (P, "", None, False),
    ],
)
def test_script_matches(arg, script, cwd, expected):
    assert _procs.script_matches(arg, script, cwd) is expected


def test_executed_scripts_names_the_launcher_script_and_the_training_script():
    argv = ["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node", "2", P]
    assert _procs.executed_scripts(argv) == ["/usr/local/bin/torchrun", P]


def _proc(pid, ppid, argv, cwd=None):
    return ProcInfo(pid=pid, ppid=ppid, name=_procs.program_name(argv), cmdline=tuple(argv), cwd=cwd)


def test_match_script_selects_the_run_and_never_a_lookalike_in_one_table():
    table = {
        1: _proc(1, 0, ["/sbin/init"]),
        100: _proc(100, 1, ["bash"]),
        4100: _proc(4100, 100, ["torchrun", "--nproc-per-node", "2", P]),
        4101: _proc(4101, 4100, ["/usr/bin/python3", "-u", P, "--local-rank", "0"]),
        4102: _proc(4102, 4100, ["/usr/bin/python3", "-u", P, "--local-rank", "1"]),
        5000 + 1: _proc(5001, 100, ["less", P]),
        5002: _proc(5002, 100, ["vim", P]),
        5003: _proc(5003, 100, ["grep", "-n", "loss", P]),
        5004: _proc(5004, 100, ["tail", "-f", P]),
        5005: _proc(5005, 100, ["watch", "-n", "1", f"pgrep -af {S}"]),
        5006: _proc(5006, 100, ["ssh", "ct200", "python3", P]),
        5007: _proc(5007, 100, ["python3", "-c", "pass", P]),
        5008: _proc(5008, 100, ["python3", "train_dflash_pipeline.py"], cwd="/home/me/copy"),
    }
    assert _procs.match_script(table, S) == [4100, 4101, 4102, 5008]
    assert _procs.match_script(table, P) == [4100, 4101, 4102]  # the copy elsewhere is another script
    tree = _procs.build_tree(table, _procs.match_script(table, P), {})
    assert tree.pids == [4100, 4101, 4102]


@pytest.mark.parametrize(
    ("argv", "name", "lookalike"),
    [
        (["less", P], "less", True),
        (["/usr/bin/vim", P], "vim", True),
        (["tail", "-f", P], "tail", True),
        (["ssh", "-F", "cfg", "python3", P], "tail", True),  # exec -a ssh tail ...: argv[0] decides
        (["python3", "-c", "pass", P], "python3", True),
        (["python3", P], "python3", False),
        (["torchrun", P], "torchrun", False),
        (["bash", "-c", f"python3 {P}"], "bash", False),
    ],
)
def test_lookalike_reason(argv, name, lookalike):
    info = ProcInfo(pid=10, ppid=1, name=name, cmdline=tuple(argv))
    assert (_procs.lookalike_reason(info) is not None) is lookalike
