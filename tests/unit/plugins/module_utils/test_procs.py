"""_procs: tables for the pure tree logic, real processes for identity, signalling and halting.

Every real process here is started by the test itself (a child ``python -c`` with a unique token in its
command line, or the fake training run); nothing else on the machine is ever signalled.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _procs as procs
from ansible_collections.specdec.pivot.plugins.module_utils._procs import ProcInfo

HELPERS = Path(__file__).resolve().parents[3] / "helpers"
LAUNCHER_RE = re.compile(procs.DEFAULT_LAUNCHER_REGEX)
SELF = 9000  # the module's own pid in the synthetic tables


def P(pid, ppid, cmd, name=None, user="trainer", status="sleeping", kthread=False):
    argv = tuple(cmd.split()) if cmd else ()
    return ProcInfo(
        pid=pid,
        ppid=ppid,
        name=name or (os.path.basename(argv[0]) if argv else ""),
        username=user,
        cmdline=argv,
        create_time=1000.0 + pid,
        start_ticks=pid * 10,
        status=status,
        kernel_thread=kthread,
        uid=1000 if user == "trainer" else 0,
    )


def load_fake_training_run():
    spec = importlib.util.spec_from_file_location("fake_training_run", HELPERS / "fake_training_run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fake_training_run", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def table(*infos):
    return {i.pid: i for i in infos}


# A host: init, sshd -> ansible's shell -> the module (SELF); a torchrun run with 3 workers; unrelated stuff.
BASE = [
    P(1, 0, "/sbin/init", name="systemd", user="root"),
    P(2, 0, "", name="kthreadd", user="root", kthread=True),
    P(3, 2, "", name="kworker/0:1", user="root", kthread=True),
    P(700, 1, "sshd: /usr/sbin/sshd -D", name="sshd", user="root"),
    P(8000, 700, "sshd: trainer@notty", name="sshd", user="trainer"),
    P(8990, 8000, "/bin/sh -c python3 /home/trainer/.ansible/tmp/ansible-tmp-1/AnsiballZ_training_process.py"),
    P(SELF, 8990, "python3 /home/trainer/.ansible/tmp/ansible-tmp-1/AnsiballZ_training_process.py"),
    P(9001, SELF, "nvidia-smi --query-gpu=index"),  # the module's own child
    P(4000, 1, "/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 3 train_dflash_pipeline.py --lr 1e-4"),
    P(4001, 4000, "/usr/bin/python3 -u train_dflash_pipeline.py --lr 1e-4 --local-rank 0"),
    P(4002, 4000, "/usr/bin/python3 -u train_dflash_pipeline.py --lr 1e-4 --local-rank 1"),
    P(4003, 4000, "/usr/bin/python3 -u train_dflash_pipeline.py --lr 1e-4 --local-rank 2"),
    P(4010, 4001, "/usr/bin/python3 -c from multiprocessing.spawn import spawn_main"),  # dataloader worker
    P(5000, 1, "vim notes.txt"),
]


def base(*extra, drop=()):
    infos = [i for i in BASE if i.pid not in drop] + list(extra)
    return table(*infos)


def tree_for(tab, selected, launcher=True, user=None):
    return procs.build_tree(
        tab, selected, procs.protected_pids(tab, SELF), launcher_re=LAUNCHER_RE if launcher else None, user=user
    )


# ----------------------------------------------------------------------------------------- parse_proc_stat


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "4001 (python3) S 4000 4001 4000 0 -1 4194560 100 0 0 0 5 1 0 0 20 0 1 0 123456 1000 200 184467440",
            {"pid": 4001, "comm": "python3", "state": "S", "ppid": 4000, "flags": 4194560, "start_ticks": 123456},
        ),
        (  # a comm with spaces and parentheses: fields are counted after the LAST ')'
            "77 (my (odd) name) R 1 77 77 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0",
            {"pid": 77, "comm": "my (odd) name", "state": "R", "ppid": 1, "flags": 4194304, "start_ticks": 999},
        ),
        (  # a kernel thread: PF_KTHREAD (0x00200000) in flags
            "3 (kworker/0:1) I 2 0 0 0 -1 69238880 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0",
            {"pid": 3, "comm": "kworker/0:1", "state": "I", "ppid": 2, "flags": 69238880, "start_ticks": 5},
        ),
        ("", None),
        ("garbage", None),
        ("12 (x) S 1 2", None),  # truncated
    ],
)
def test_parse_proc_stat(text, expected):
    assert procs.parse_proc_stat(text) == expected


def test_parse_proc_stat_of_this_process():
    parsed = procs.parse_proc_stat(Path("/proc/self/stat").read_text())
    assert parsed["pid"] == os.getpid()
    assert parsed["ppid"] == os.getppid()
    assert not parsed["flags"] & procs.PF_KTHREAD
    assert parsed["start_ticks"] > 0


# ------------------------------------------------------------------------------------ ancestry and roles


def test_ancestors_and_descendants():
    tab = base()
    assert procs.ancestors(tab, SELF) == [8990, 8000, 700, 1]
    assert procs.descendants(tab, 4000) == [4001, 4002, 4003, 4010]  # breadth-first
    assert procs.ancestors(tab, 424242) == []


def test_ancestors_survive_a_ppid_cycle():
    tab = table(P(10, 11, "a"), P(11, 10, "b"))
    assert procs.ancestors(tab, 10) == [11]


def test_protected_pids_are_self_ancestors_and_own_children():
    protected = procs.protected_pids(base(), SELF)
    assert set(protected) == {SELF, 8990, 8000, 700, 1, 9001}
    assert protected[SELF] == "the module's own process"
    assert protected[9001] == "a child of the module's process"


@pytest.mark.parametrize(
    ("info", "reason"),
    [
        (P(1, 0, "/sbin/init", name="systemd"), "PID 1 (init)"),
        (P(3, 2, "", name="kworker/0:1", kthread=True), "a kernel thread"),
        (P(701, 1, "/usr/sbin/sshd -D", name="sshd"), "a protected system program (sshd)"),
        (P(702, 1, "sudo -u trainer python train.py", name="sudo"), "a protected system program (sudo)"),
        (P(703, 1, "/usr/bin/python3 /usr/bin/ansible-playbook site.yml", name="ansible-pl"), "an Ansible process"),
        (P(704, 1, "/usr/bin/python3 /usr/local/bin/ansible all -m ping", name="python3"), "an Ansible process"),
        (
            P(705, 1, "python3 /root/.ansible/tmp/ansible-tmp-9/AnsiballZ_command.py", name="python3"),
            "an Ansible process",
        ),
        (P(706, 1, "/usr/bin/python3 train.py --out /runs/ansible-exp"), None),  # 'ansible' only in an argument
        (P(4001, 4000, "/usr/bin/python3 -u train_dflash_pipeline.py"), None),
        (P(SELF, 8990, "python3 x.py"), "the module's own process"),
    ],
)
def test_protection_reason(info, reason):
    assert procs.protection_reason(info, {SELF: "the module's own process"}) == reason


@pytest.mark.parametrize(
    ("cmdline", "is_launcher"),
    [
        ("/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 8 train.py", True),
        ("torchrun --standalone train.py", True),
        ("/usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 train.py", True),
        ("python -m torch.distributed.launch train.py", True),
        ("/usr/bin/python3 /usr/local/bin/deepspeed --num_gpus 8 train.py", True),
        ("python -u -m deepspeed.launcher.launch --world_info=x train.py", True),
        ("/usr/bin/python3 /usr/local/bin/accelerate launch train.py", True),
        ("python -m accelerate.commands.launch train.py", True),
        ("python fake_training_run.py torchrun --token x", True),
        ("python train.py --out /runs/torchrun_exp", False),
        ("vim torchrun.sh", False),
        ("/opt/accelerate/bin/python train.py", False),
        ("bash run.sh", False),
        ("python -m torch.distributed.runner_extra", False),
    ],
)
def test_default_launcher_regex(cmdline, is_launcher):
    assert bool(LAUNCHER_RE.search(cmdline)) is is_launcher


def test_match_cmdline_skips_processes_without_cmdline():
    tab = base()
    assert procs.match_cmdline(tab, re.compile("kworker|kthreadd")) == []
    assert procs.match_cmdline(tab, re.compile(r"train_dflash_pipeline\.py")) == [4000, 4001, 4002, 4003]


# --------------------------------------------------------------------------------------------- build_tree
TREE_CASES = [
    # id, selected, extra procs, launcher?, user, expected pids in order, roles, excluded pids
    (
        "workers-matched-launcher-joins",
        [4001, 4002, 4003],
        [],
        True,
        None,
        [4000, 4001, 4002, 4003, 4010],
        {4000: "launcher", 4001: "root", 4002: "root", 4003: "root", 4010: "child"},
        [],
    ),
    (
        "launcher-and-workers-matched",
        [4000, 4001, 4002, 4003],
        [],
        True,
        None,
        [4000, 4001, 4002, 4003, 4010],
        {4000: "root", 4001: "child", 4002: "child", 4003: "child", 4010: "child"},
        [],
    ),
    (
        "one-worker-pid-brings-the-whole-run",
        [4002],
        [],
        True,
        None,
        [4000, 4001, 4002, 4003, 4010],
        {4000: "launcher", 4001: "child", 4002: "root", 4003: "child", 4010: "child"},
        [],
    ),
    (
        "include-launcher-off",
        [4002],
        [],
        False,
        None,
        [4002],
        {4002: "root"},
        [],
    ),
    (
        "a-plain-parent-is-not-part-of-the-run",
        [6001],
        [P(6000, 1, "bash run.sh"), P(6001, 6000, "python train.py"), P(6002, 6000, "tail -f log")],
        True,
        None,
        [6001],
        {6001: "root"},
        [],
    ),
    (
        "python-m-torch-distributed-run-parent",
        [6101],
        [P(6100, 1, "python -m torch.distributed.run --nproc_per_node 1 t.py"), P(6101, 6100, "python t.py")],
        True,
        None,
        [6100, 6101],
        {6100: "launcher", 6101: "root"},
        [],
    ),
    (
        "nested-launchers-walk-up",
        [6202],
        [
            P(6200, 1, "/usr/bin/python3 /usr/local/bin/accelerate launch t.py"),
            P(6201, 6200, "python -m torch.distributed.run t.py"),
            P(6202, 6201, "python t.py"),
        ],
        True,
        None,
        [6200, 6201, 6202],
        {6200: "launcher", 6201: "launcher", 6202: "root"},
        [],
    ),
    (
        "protected-matches-are-excluded-not-expanded",
        [1, 700, 8000, SELF, 8990, 4001],
        [],
        True,
        None,
        [4000, 4001, 4002, 4003, 4010],
        {4000: "launcher", 4001: "root", 4002: "child", 4003: "child", 4010: "child"},
        [1, 700, 8000, 8990, SELF],
    ),
    (
        "run-started-under-sudo-and-screen",
        [6302],
        [
            P(6300, 1, "SCREEN -dmS train", name="screen"),
            P(6301, 6300, "sudo -u trainer python t.py", name="sudo"),
            P(6302, 6301, "python t.py"),
        ],
        True,
        None,
        [6302],
        {6302: "root"},
        [],
    ),
    (
        "protected-descendant-and-its-subtree-are-skipped",
        [6400],
        [
            P(6400, 1, "python orchestrate.py"),
            P(6401, 6400, "sudo -u x cmd", name="sudo"),
            P(6402, 6401, "cmd"),
            P(6403, 6400, "python worker.py"),
        ],
        True,
        None,
        [6400, 6403],
        {6400: "root", 6403: "child"},
        [6401],
    ),
    (
        "user-filter-drops-other-users",
        [4001, 4002, 4003],
        [P(6500, 4001, "python helper.py", user="root")],
        True,
        "trainer",
        [4000, 4001, 4002, 4003, 4010],
        None,
        [6500],
    ),
    (
        "user-filter-by-uid",
        [4001],
        [],
        True,
        "1000",
        [4000, 4001, 4002, 4003, 4010],
        None,
        [],
    ),
    (
        "user-filter-excludes-everything",
        [4001, 4002, 4003],
        [],
        True,
        "alice",
        [],
        {},
        [4001, 4002, 4003],
    ),
    (
        "zombie-child-is-excluded",
        [4001],
        [P(6600, 4001, "", name="python", status="zombie")],
        False,
        None,
        [4001, 4010],
        {4001: "root", 4010: "child"},
        [6600],
    ),
    (
        "launcher-that-is-our-ancestor-stops-the-walk",
        [6702],
        [P(6700, 8990, "torchrun --standalone t.py"), P(6702, 6700, "python t.py")],
        True,
        None,
        [6702],
        {6702: "root"},
        [],
    ),
    ("nothing-selected", [], [], True, None, [], {}, []),
    ("selected-pid-vanished", [424242], [], True, None, [], {}, []),
]


@pytest.mark.parametrize(
    ("selected", "extra", "launcher", "user", "pids", "roles", "excluded"),
    [c[1:] for c in TREE_CASES],
    ids=[c[0] for c in TREE_CASES],
)
def test_build_tree(selected, extra, launcher, user, pids, roles, excluded):
    tab = base(*extra)
    if any(e.pid == 6700 for e in extra):  # make the torchrun an ancestor of SELF
        tab[8990] = P(8990, 6700, "/bin/sh -c python3 AnsiballZ_training_process.py")
    tree = tree_for(tab, selected, launcher=launcher, user=user)
    assert tree.pids == pids
    if roles is not None:
        assert tree.roles == roles
    assert [e["pid"] for e in tree.excluded] == sorted(excluded)
    assert all(e["reason"] for e in tree.excluded)
    assert not {SELF, 1, 2, 700, 8000, 8990, 9001} & set(tree.pids)  # never, whatever was selected


def test_build_tree_reasons_and_process_dicts():
    tab = base(P(6500, 4001, "python helper.py", user="root"))
    tree = tree_for(tab, [SELF, 1, 4001], user="trainer")
    reasons = {e["pid"]: e["reason"] for e in tree.excluded}
    assert reasons[SELF] == "the module's own process"
    assert reasons[1] == "PID 1 (init)"
    assert reasons[6500] == "owned by root, not by user trainer"
    first = tree.processes()[0]
    assert first == {
        "pid": 4000,
        "ppid": 1,
        "name": "python3",
        "username": "trainer",
        "status": "sleeping",
        "role": "launcher",
        "cmdline": "/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 3 train_dflash_pipeline.py --lr 1e-4",
        "create_time": 5000.0,
    }
    assert tree.matched == [SELF, 1, 4001]


# ------------------------------------------------------------------------------------------- small helpers


@pytest.mark.parametrize(
    ("gpus", "pids", "expected"),
    [
        ([], [1], []),
        (None, [1], []),
        (
            [
                {
                    "index": 0,
                    "uuid": "GPU-a",
                    "compute_processes": [
                        {"pid": 4001, "name": "python3", "used_mib": 70000},
                        {"pid": 777, "name": "other", "used_mib": 10},
                    ],
                },
                {
                    "index": 1,
                    "uuid": "GPU-b",
                    "compute_processes": [{"pid": 4002, "name": "python3", "used_mib": None}],
                },
            ],
            [4001, 4002, 4003],
            [
                {"pid": 4001, "gpu_index": 0, "gpu_uuid": "GPU-a", "name": "python3", "used_mib": 70000},
                {"pid": 4002, "gpu_index": 1, "gpu_uuid": "GPU-b", "name": "python3", "used_mib": None},
            ],
        ),
        ([{"index": 0, "uuid": "GPU-a", "compute_processes": [{"pid": None, "name": "?", "used_mib": 1}]}], [0], []),
        ([{"index": 0, "uuid": "GPU-a", "compute_processes": []}], [4001], []),
    ],
)
def test_pids_on_gpus(gpus, pids, expected):
    assert procs.pids_on_gpus(gpus, pids) == expected


@pytest.mark.parametrize(("name", "number"), [("SIGTERM", 15), ("SIGKILL", 9), ("SIGINT", 2), ("SIGHUP", 1)])
def test_signal_number_and_name(name, number):
    assert procs.signal_number(name) == number
    assert procs.signal_name(number) == name


@pytest.mark.parametrize("bad", ["TERM", "SIGSTOP", "sigterm", ""])
def test_signal_number_rejects_unknown(bad):
    with pytest.raises(ValueError, match="use one of SIGTERM"):
        procs.signal_number(bad)


# ------------------------------------------------------------------------------------------ real processes


@pytest.fixture
def spawn():
    """Start ``python -c CODE TOKEN`` children; every one still running is killed at teardown.

    The child runs ``setup`` (e.g. installs signal handling), says "ready" on stdout, then sleeps forever
    (``forever=True``) or exits.
    """
    started: list[subprocess.Popen] = []

    def _spawn(setup: str = "", forever: bool = True) -> subprocess.Popen:
        token = f"procs-{uuid.uuid4().hex[:12]}"
        code = "\n".join(
            [
                "import signal, sys, time",
                setup,
                "sys.stdout.write('ready\\n')",
                "sys.stdout.flush()",
                "while True: time.sleep(1)" if forever else "",
            ]
        )
        proc = subprocess.Popen([sys.executable, "-c", code, token], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout.readline() == "ready\n"  # handlers installed, no sleep needed
        return proc

    yield _spawn
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


SLEEPER = ""
IGNORE_TERM = "signal.signal(signal.SIGTERM, signal.SIG_IGN)"


def test_snapshot_sees_our_child_with_exact_identity(spawn):
    child = spawn(SLEEPER)
    tab = procs.snapshot()
    info = tab[child.pid]
    assert info.ppid == os.getpid()
    assert info.cmdline[-1].startswith("procs-")
    assert info.start_ticks == procs.parse_proc_stat(Path(f"/proc/{child.pid}/stat").read_text())["start_ticks"]
    assert info.create_time == pytest.approx(psutil.Process(child.pid).create_time(), abs=1.0)
    assert info.kernel_thread is False
    assert info.username
    # every process flagged as a kernel thread has no command line (they are never matched)
    assert all(not i.cmdline for i in tab.values() if i.kernel_thread)
    again = procs.read_process(child.pid)
    assert (again.pid, again.ppid, again.cmdline, again.start_ticks) == (
        info.pid,
        info.ppid,
        info.cmdline,
        info.start_ticks,
    )


def test_read_process_of_a_reaped_pid_is_none(spawn):
    child = spawn(forever=False)
    child.wait()
    assert procs.read_process(child.pid) is None


def test_signal_exact_delivers_to_the_right_process(spawn):
    child = spawn(SLEEPER)
    info = procs.read_process(child.pid)
    assert procs.identity_state(info) == "alive"
    assert procs.signal_exact(info, signal.SIGTERM) == "sent"
    assert child.wait(timeout=10) == -signal.SIGTERM


def test_pid_reuse_protection_start_ticks(spawn):
    """A live process whose start time differs from the recorded one is another process: never signalled."""
    child = spawn(SLEEPER)
    info = procs.read_process(child.pid)
    stale = ProcInfo(**{**info.__dict__, "start_ticks": info.start_ticks - 1})  # "the process that had this pid"
    assert procs.identity_state(stale) == "reused"
    assert procs.signal_exact(stale, signal.SIGKILL) == "reused"
    assert procs.is_gone(stale) is True  # the recorded process is gone, whoever holds the pid now
    assert child.poll() is None  # the current holder of the pid was not touched
    assert procs.probe_permission([stale]) == []


def test_pid_reuse_protection_create_time_fallback(spawn):
    """Without /proc start ticks the psutil create_time must match within the tolerance."""
    child = spawn(SLEEPER)
    info = procs.read_process(child.pid)
    fallback = ProcInfo(**{**info.__dict__, "start_ticks": None})
    assert procs.identity_state(fallback) == "alive"
    stale = ProcInfo(**{**fallback.__dict__, "create_time": info.create_time - 10})
    assert procs.signal_exact(stale, signal.SIGKILL) == "reused"
    assert child.poll() is None
    assert procs.signal_exact(fallback, signal.SIGTERM) == "sent"
    assert child.wait(timeout=10) == -signal.SIGTERM


def test_signal_exact_on_gone_and_zombie(spawn):
    child = spawn(SLEEPER)
    info = procs.read_process(child.pid)
    os.kill(child.pid, signal.SIGKILL)  # our own unreaped child: it stays a zombie until we wait() for it
    deadline = time.monotonic() + 10
    while procs.identity_state(info) == "alive" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert procs.identity_state(info) == "zombie"
    assert procs.is_gone(info)
    assert procs.signal_exact(info, signal.SIGTERM) == "zombie"
    assert procs.read_process(child.pid).status == "zombie"
    child.wait()
    assert procs.identity_state(info) == "gone"
    assert procs.signal_exact(info, signal.SIGTERM) == "gone"
    assert procs.read_process(child.pid) is None


def test_probe_permission_allows_our_own_child(spawn):
    child = spawn(SLEEPER)
    assert procs.probe_permission([procs.read_process(child.pid)]) == []
    assert child.poll() is None  # kill(pid, 0) delivers nothing


def test_halt_tree_escalates_only_the_survivor(spawn):
    polite = spawn(SLEEPER)
    stubborn = spawn(IGNORE_TERM)
    members = [procs.read_process(polite.pid), procs.read_process(stubborn.pid)]
    result = procs.halt_tree(members, signal.SIGTERM, timeout=20, kill_after=0.3)
    assert result.survivors == []
    assert result.escalated is True
    assert result.signals_sent == [
        {"pid": polite.pid, "signal": "SIGTERM"},
        {"pid": stubborn.pid, "signal": "SIGTERM"},
        {"pid": stubborn.pid, "signal": "SIGKILL"},
    ]
    assert polite.wait(timeout=5) == -signal.SIGTERM
    assert stubborn.wait(timeout=5) == -signal.SIGKILL
    assert set(result.zombies) <= {polite.pid, stubborn.pid}


def test_halt_tree_times_are_the_elapsed_time_apart(spawn):
    """The halt's wall-clock start and end (the report prints them beside elapsed_s) are elapsed_s apart, even when
    the wall clock jumps during the halt (it is read once; the end is the start plus the monotonic time)."""
    stubborn = spawn(IGNORE_TERM)
    members = [procs.read_process(stubborn.pid)]
    walls = iter([1_000.0, 5_000.0])  # a second reading would be 4000 s later
    result = procs.halt_tree(members, signal.SIGTERM, timeout=20, kill_after=0.3, wall=lambda: next(walls))
    assert result.survivors == [] and result.escalated is True
    assert result.started_at == 1_000.0
    assert result.elapsed_s >= 0.3
    assert abs((result.ended_at - result.started_at) - result.elapsed_s) < 0.0005


def test_halt_tree_without_escalation_reports_survivors(spawn):
    stubborn = spawn(IGNORE_TERM)
    members = [procs.read_process(stubborn.pid)]
    result = procs.halt_tree(members, signal.SIGTERM, timeout=0.3, kill_after=0.0, escalate=False)
    assert [s.pid for s in result.survivors] == [stubborn.pid]
    assert result.escalated is False
    assert result.signals_sent == [{"pid": stubborn.pid, "signal": "SIGTERM"}]
    assert stubborn.poll() is None


def test_halt_tree_signals_latecomers_found_by_discover(spawn):
    stubborn = spawn(IGNORE_TERM)  # keeps the wait loop running until SIGKILL, so discover is consulted
    late = spawn(SLEEPER)  # stands for a worker a launcher restarted after the snapshot
    late_info = procs.read_process(late.pid)
    calls = []

    def discover(alive):
        calls.append(sorted(a.pid for a in alive))
        return [late_info] if len(calls) == 1 else []

    result = procs.halt_tree(
        [procs.read_process(stubborn.pid)], signal.SIGTERM, timeout=20, kill_after=0.3, discover=discover
    )
    assert calls[0] == [stubborn.pid]
    assert [m.pid for m in result.late_members] == [late.pid]
    assert {"pid": late.pid, "signal": "SIGTERM"} in result.signals_sent
    assert {"pid": stubborn.pid, "signal": "SIGKILL"} in result.signals_sent
    assert result.survivors == []
    assert late.wait(timeout=5) == -signal.SIGTERM
    assert stubborn.wait(timeout=5) == -signal.SIGKILL


def test_new_descendants_finds_children_born_after_the_snapshot(tmp_path):
    run = load_fake_training_run().start(tmp_path, f"procs{uuid.uuid4().hex[:10]}", nproc=2)
    try:
        launcher = procs.read_process(run.launcher_pid)
        known = {run.launcher_pid, run.worker_pids[0]}  # pretend the snapshot saw only worker 0
        found = procs.new_descendants([launcher], known, {os.getpid(): "self"})
        assert [f.pid for f in found] == [run.worker_pids[1]]
        assert run.worker_pids[1] in known
        assert procs.new_descendants([launcher], known, {}) == []  # nothing new the second time
    finally:
        run.cleanup()
