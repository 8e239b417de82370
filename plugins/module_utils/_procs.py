# Private module_utils for specdec.pivot: process-tree discovery, matching, signalling and waiting.
"""Find a training run's process tree and halt it without ever touching anything else.

Layout:

* Pure functions over a process table (``dict[pid, ProcInfo]``), tested with hand-written tables:
  :func:`parse_proc_stat`, :func:`ancestors`, :func:`descendants`, :func:`protection_reason`,
  :func:`protected_pids`, :func:`match_cmdline`, :func:`build_tree`, :func:`pids_on_gpus`.
* Thin I/O around them: :func:`snapshot` (psutil + ``/proc/<pid>/stat``), :func:`signal_exact`,
  :func:`is_gone`, :func:`probe_permission`, :func:`halt_tree`.

Identity: a process is the pair (pid, start time). On Linux the start time is ``starttime`` from
``/proc/<pid>/stat`` (clock ticks since boot: exact and immune to wall-clock changes); elsewhere psutil's
``create_time`` within :data:`CREATE_TIME_TOLERANCE_S`. A pid whose start time changed belongs to another
process and is never signalled. Where the kernel offers pidfds (Linux >= 5.3, Python >= 3.9) the identity
is checked on an open pidfd and the signal goes through that pidfd, so there is no window between the check
and the signal.

Signal order: top-down (launchers first, then the matched roots, then their descendants breadth-first). A
launcher such as torchrun that sees its workers die first may restart them (elastic ``max_restarts``);
signalled first, it stops supervising and forwards the signal itself. Every member is then signalled too, so
a launcher that does not forward cannot leave workers behind. While waiting, children that appear under
members (a restart racing the halt) join the tree and get the same signal.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass, field

try:
    import psutil

    HAS_PSUTIL = True
    PSUTIL_IMPORT_ERROR = None
except ImportError as _err:  # pragma: no cover - depends on the target host
    psutil = None
    HAS_PSUTIL = False
    PSUTIL_IMPORT_ERROR = _err

CREATE_TIME_TOLERANCE_S = 1.0
PF_KTHREAD = 0x00200000

# Programs that are never part of a training run and must never be signalled, whatever the pattern says.
PROTECTED_NAMES = frozenset(
    {
        "init",
        "systemd",
        "sshd",
        "sshd-session",
        "sshd-auth",
        "sudo",
        "su",
        "login",
        "agetty",
        "dbus-daemon",
        "containerd",
        "containerd-shim",
        "containerd-shim-runc-v2",
        "dockerd",
        "tmux: server",
        "screen",
        "SCREEN",
    }
)
_ANSIBLE_TOKEN_RE = re.compile(r"(?:^|/)ansible(?:-[a-z]+)?$|(?:^|/)ansible-connection$")
_ANSIBALLZ_RE = re.compile(r"AnsiballZ_|ansible_async_wrapper|/\.ansible/tmp/")

# A parent of a matched process counts as part of the run when its command line matches this.
DEFAULT_LAUNCHER_REGEX = (
    r"(?:^|[\s/])(?:torchrun|deepspeed|accelerate)(?:\s|$)"
    r"|-m\s+(?:torch\.distributed\.(?:run|launch)|deepspeed\.launcher\.launch|accelerate\.commands\.launch)(?:\s|$)"
)

SIGNAL_CHOICES = ("SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGKILL", "SIGUSR1", "SIGUSR2")

ROLE_LAUNCHER = "launcher"
ROLE_ROOT = "root"
ROLE_CHILD = "child"


@dataclass(frozen=True)
class ProcInfo:
    """One process as seen in a snapshot."""

    pid: int
    ppid: int
    name: str = ""
    username: str = ""
    cmdline: tuple = ()
    create_time: float = 0.0
    start_ticks: int | None = None
    status: str = "running"
    kernel_thread: bool = False
    uid: int | None = None
    cwd: str | None = None
    exe: str | None = None  # the executable the kernel runs (/proc/PID/exe); None when it cannot be read

    @property
    def cmdline_str(self) -> str:
        return " ".join(self.cmdline)

    def as_dict(self, role: str | None = None) -> dict:
        data = {
            "pid": self.pid,
            "ppid": self.ppid,
            "name": self.name,
            "username": self.username,
            "cmdline": self.cmdline_str,
            "create_time": self.create_time,
            "status": self.status,
        }
        if role is not None:
            data["role"] = role
        return data


@dataclass
class Tree:
    """A selected run: members in signal order, their roles, and what was left out and why."""

    members: list = field(default_factory=list)  # ProcInfo, top-down
    roles: dict = field(default_factory=dict)  # pid -> role
    matched: list = field(default_factory=list)  # pids selected by pattern/pid before expansion
    excluded: list = field(default_factory=list)  # [{pid, reason, name, cmdline}]

    @property
    def pids(self) -> list:
        return [m.pid for m in self.members]

    def processes(self) -> list:
        return [m.as_dict(self.roles.get(m.pid)) for m in self.members]


# ---------------------------------------------------------------------------------------------- pure helpers


def parse_proc_stat(text: str) -> dict | None:
    """Parse ``/proc/<pid>/stat``: ``{"pid", "comm", "state", "ppid", "flags", "start_ticks"}``.

    The command name may contain spaces and parentheses, so the fixed fields are taken after the LAST ``)``.
    Returns None for text that is not a stat line.
    """
    text = text.strip()
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren <= 0 or close_paren < open_paren:
        return None
    try:
        pid = int(text[:open_paren].strip())
        rest = text[close_paren + 1 :].split()
        return {
            "pid": pid,
            "comm": text[open_paren + 1 : close_paren],
            "state": rest[0],
            "ppid": int(rest[1]),
            "flags": int(rest[6]),
            "start_ticks": int(rest[19]),
        }
    except (ValueError, IndexError):
        return None


def ancestors(table: dict, pid: int) -> list:
    """Pids of the parent, grandparent, ... of ``pid`` that are in ``table`` (nearest first)."""
    chain: list = []
    seen = {pid}
    info = table.get(pid)
    while info is not None and info.ppid not in seen and info.ppid > 0:
        chain.append(info.ppid)
        seen.add(info.ppid)
        info = table.get(info.ppid)
    return chain


def children_map(table: dict) -> dict:
    kids: dict = {}
    for info in table.values():
        if info.ppid != info.pid:
            kids.setdefault(info.ppid, []).append(info.pid)
    for pids in kids.values():
        pids.sort()
    return kids


def descendants(table: dict, pid: int, kids: dict | None = None) -> list:
    """All descendants of ``pid`` in breadth-first order (children before grandchildren)."""
    kids = children_map(table) if kids is None else kids
    order: list = []
    queue = list(kids.get(pid, []))
    seen = {pid}
    while queue:
        current = queue.pop(0)
        if current in seen:
            continue
        seen.add(current)
        order.append(current)
        queue.extend(kids.get(current, []))
    return order


def protected_pids(table: dict, self_pid: int) -> dict:
    """``{pid: reason}`` for the caller itself, its ancestors and its descendants (the module's own helpers)."""
    result = {self_pid: "the module's own process"}
    for pid in ancestors(table, self_pid):
        result[pid] = "an ancestor of the module's process"
    for pid in descendants(table, self_pid):
        result[pid] = "a child of the module's process"
    return result


def protection_reason(info: ProcInfo, protected: dict) -> str | None:
    """Why ``info`` must never be signalled, or None when it may be."""
    if info.pid in (0, 1):
        return f"PID {info.pid} (init)"
    if info.pid in protected:
        return protected[info.pid]
    if info.kernel_thread:
        return "a kernel thread"
    if info.name in PROTECTED_NAMES:
        return f"a protected system program ({info.name})"
    head = info.cmdline[:3]
    if any(_ANSIBLE_TOKEN_RE.search(tok) for tok in head) or _ANSIBALLZ_RE.search(info.cmdline_str):
        return "an Ansible process"
    return None


#: Command lines of unrelated processes: a pattern that matches every one of them (or the empty string) matches
#: about any process, so it cannot stand for one training run.
CATCH_ALL_PROBES = ("/sbin/init", "sshd: root@pts/0", "-bash", "sleep 60", "/usr/lib/systemd/systemd-journald")


def pattern_problem(table: dict, pattern: re.Pattern, protected: dict, user: str | None = None) -> str | None:
    """Why a raw ``pattern`` cannot select one training run, or None.

    Refused: a catch-all (it matches the empty string or every :data:`CATCH_ALL_PROBES` line); a pattern that
    matches a process that is never signalled (PID 1, sshd and the other :data:`PROTECTED_NAMES`, an Ansible
    process, the module itself or its ancestors - the controller's own processes where it runs on this host); one
    that matches processes of several users when ``user`` is not given (pagers, editors and the like that only name
    the script are not counted).
    """
    if pattern.search("") is not None or all(pattern.search(line) for line in CATCH_ALL_PROBES):
        return "matches any command line (a catch-all)"
    matched = match_cmdline(table, pattern)
    for pid in matched:
        info = table[pid]
        why = protection_reason(info, protected)
        if why:
            return f"matches pid {pid} ({info.name}: {info.cmdline_str[:120]!r}), which is {why}"
    if not user:
        owners = {
            table[pid].username or str(table[pid].uid) for pid in matched if lookalike_reason(table[pid]) is None
        }
        if len(owners) > 1:
            return f"matches processes of several users ({', '.join(sorted(owners))})"
    return None


def match_cmdline(table: dict, pattern: re.Pattern) -> list:
    """Pids whose full command line (argv joined by spaces) matches ``pattern``; sorted.

    Processes without a command line (kernel threads, zombies) never match.
    """
    return sorted(pid for pid, info in table.items() if info.cmdline and pattern.search(info.cmdline_str))


# ------------------------------------------------------------------ what executes a script (not what names it)

# Interpreters whose first positional argument is the script they run.
_INTERPRETER_RE = re.compile(r"^(?:python|pypy)(?:\d+(?:\.\d+)*)?[dmu]?$")
# Python options that take a value (the next argument, or the rest of the same argument).
_PY_VALUE_SHORT = frozenset("WX")
_PY_VALUE_LONG = frozenset({"--check-hash-based-pycs"})
# Launchers by program (or console-script) name, and by the module that ``python -m`` runs.
LAUNCHER_PROGRAMS = frozenset({"torchrun", "deepspeed", "accelerate"})
LAUNCHER_MODULES = frozenset(
    {
        "torch.distributed.run",
        "torch.distributed.launch",
        "deepspeed.launcher.runner",
        "deepspeed.launcher.launch",
        "accelerate.commands.launch",
        "accelerate.commands.accelerate_cli",
    }
)
# Launcher flags that take no value (every other option without ``=`` takes the next argument as its value,
# unless that argument is a Python script: ``--foo train.py``).
_LAUNCHER_FLAGS = frozenset(
    {
        "--standalone",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
        "--use-env",
        "--use_env",
        "--multi_gpu",
        "--multi-gpu",
        "--cpu",
        "--tpu",
        "--use_deepspeed",
        "--use_fsdp",
        "--use_megatron_lm",
        "--debug",
        "-q",
        "--quiet",
        "--same_network",
        "--no_local_rank",
        "--no_ssh",
        "--no_ssh_check",
        "--force_multi",
        "--save_pid",
        "--bind_cores_to_rank",
        "--elastic_training",
    }
)
_LAUNCHER_NO_PYTHON = frozenset({"--no-python", "--no_python"})
_LAUNCHER_MODULE_FLAGS = frozenset({"-m", "--module"})
# Programs that name a file without running it: pagers, editors, search and copy tools, remote clients.
LOOKALIKE_PROGRAMS = frozenset(
    {
        "less",
        "more",
        "most",
        "view",
        "vi",
        "vim",
        "nvim",
        "gvim",
        "nano",
        "emacs",
        "emacsclient",
        "code",
        "cat",
        "bat",
        "head",
        "tail",
        "grep",
        "egrep",
        "fgrep",
        "rg",
        "ag",
        "ack",
        "awk",
        "sed",
        "watch",
        "ssh",
        "scp",
        "rsync",
        "sftp",
        "man",
        "diff",
        "git",
        "cp",
        "mv",
        "ls",
        "find",
        "stat",
        "file",
        "md5sum",
        "sha256sum",
        "ps",
        "pgrep",
        "pkill",
        "top",
        "htop",
        "strace",
        "gdb",
        "py-spy",
    }
)


def program_name(argv) -> str:
    """Base name of ``argv[0]`` (``/usr/bin/python3.11`` -> ``python3.11``); empty for an empty argv."""
    return os.path.basename(argv[0]) if argv else ""


def is_interpreter(name: str) -> bool:
    """``python``, ``python3``, ``python3.11``, ``pypy3`` ...: a program whose script argument it runs."""
    return bool(_INTERPRETER_RE.match(name))


def _python_target(args: list):
    """What ``python ARGS`` runs: ``("script", path, rest)``, ``("module", name, rest)`` or None (``-c``, stdin)."""
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            return ("script", args[i + 1], args[i + 2 :]) if i + 1 < len(args) else None
        if tok == "-" or not tok.startswith("-"):
            return None if tok == "-" else ("script", tok, args[i + 1 :])
        if tok.startswith("--"):
            name = tok.split("=", 1)[0]
            i += 2 if (name in _PY_VALUE_LONG and "=" not in tok) else 1
            continue
        j = 1
        while j < len(tok):  # combined short options: -uB, -Wignore, -X dev, -m mod, -mmod
            opt = tok[j]
            rest = tok[j + 1 :]
            if opt == "c":
                return None  # a command string: the script is not executed, at most named
            if opt == "m":
                if rest:
                    return ("module", rest, args[i + 1 :])
                return ("module", args[i + 1], args[i + 2 :]) if i + 1 < len(args) else None
            if opt in _PY_VALUE_SHORT:
                if not rest:
                    i += 1  # the value is the next argument
                break
            j += 1
        i += 1
    return None


def _looks_like_script(tok: str, script: str | None) -> bool:
    return tok.endswith(".py") or (script is not None and os.path.basename(tok) == os.path.basename(script))


def _launcher_target(args: list, script: str | None):
    """The program a launcher (torchrun, deepspeed, accelerate launch) starts, as ``_python_target`` returns it."""
    i = 0
    no_python = module = False
    while i < len(args):
        tok = args[i]
        if tok == "--":
            i += 1
            break
        if not tok.startswith("-"):
            break
        name = tok.split("=", 1)[0]
        if name in _LAUNCHER_NO_PYTHON:
            no_python = True
        elif name in _LAUNCHER_MODULE_FLAGS:
            module = True
        elif "=" not in tok and name not in _LAUNCHER_FLAGS:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            if not _looks_like_script(nxt, script):
                i += 1  # the option's value
        i += 1
    if i >= len(args):
        return None
    if module:
        return ("module", args[i], args[i + 1 :])
    if no_python:
        return ("argv", args[i:], [])
    return ("script", args[i], args[i + 1 :])


def executed_scripts(argv, script: str | None = None, _depth: int = 0) -> list:
    """Scripts that the process with this ``argv`` executes, outermost first; ``[]`` when it runs none.

    ``python [opts] S args`` runs S; ``python -m torch.distributed.run [opts] S`` and ``torchrun [opts] S``
    (also as ``python /path/torchrun``), ``deepspeed [opts] S`` and ``accelerate launch [opts] S`` run S (through
    the workers they start); a launcher's ``--no-python PROG ...`` runs whatever PROG runs. A pager, editor,
    ``grep``, ``tail``, ``ssh`` or ``python -c ...`` whose arguments name a script runs nothing.
    """
    argv = list(argv or ())
    if not argv or _depth > 4:
        return []
    name = program_name(argv)
    if is_interpreter(name):
        target = _python_target(argv[1:])
    elif name in LAUNCHER_PROGRAMS:
        rest = argv[1:]
        if name == "accelerate":
            if not rest or rest[0] != "launch":
                return []
            rest = rest[1:]
        target = _launcher_target(rest, script)
    else:
        return []
    if target is None:
        return []
    kind, what, rest = target
    if kind == "argv":
        return executed_scripts(what, script, _depth + 1)
    if kind == "module":
        if what in LAUNCHER_MODULES:
            if what.endswith("accelerate_cli"):
                if not rest or rest[0] != "launch":
                    return []
                rest = rest[1:]
            inner = _launcher_target(rest, script)
            if inner is None:
                return []
            if inner[0] == "argv":
                return executed_scripts(inner[1], script, _depth + 1)
            return executed_scripts(["python", *_target_argv(inner)], script, _depth + 1)
        return []
    if os.path.basename(what) in LAUNCHER_PROGRAMS:  # python /usr/local/bin/torchrun ...
        return [what, *executed_scripts([os.path.basename(what), *rest], script, _depth + 1)]
    return [what]


def _target_argv(target) -> list:
    kind, what, rest = target
    if kind == "module":
        return ["-m", what, *rest]
    return [what, *rest]


def script_matches(arg: str, script: str, cwd: str | None = None) -> bool:
    """Whether the script argument ``arg`` is ``script``.

    A bare name (``train_dflash_pipeline.py``) matches any path with that file name; a path matches the same
    normalised path, a relative ``arg`` resolved against the process's ``cwd`` when it is known.
    """
    if not arg or not script:
        return False
    if "/" not in script:
        return os.path.basename(arg) == script
    want = os.path.normpath(script)
    if os.path.isabs(arg):
        return os.path.normpath(arg) == want
    if cwd:
        return os.path.normpath(os.path.join(cwd, arg)) == want
    return not os.path.isabs(want) and os.path.normpath(arg) == want


def executes_script(argv, script: str, cwd: str | None = None) -> bool:
    """True when a process with this ``argv`` executes ``script`` (see :func:`executed_scripts`)."""
    return any(script_matches(arg, script, cwd) for arg in executed_scripts(argv, script))


def program_agrees(info: ProcInfo) -> bool:
    """Whether the program the kernel runs agrees with ``argv[0]``, which its parent may set to anything
    (``exec -a python3 less train.py``).

    The executable (``/proc/PID/exe``) must be a Python interpreter (every launcher - torchrun, deepspeed,
    accelerate - is a Python script the interpreter runs) or the program ``argv[0]`` names. When it cannot be read
    (another user's process without root), the kernel's command name must not be a program that only names files.
    """
    exe = os.path.basename((info.exe or "").replace(" (deleted)", ""))
    if exe:
        return is_interpreter(exe) or exe == program_name(info.cmdline)
    return info.name not in LOOKALIKE_PROGRAMS


def match_script(table: dict, script: str) -> list:
    """Pids of processes that execute ``script`` (interpreters and launchers running it, as their executable
    confirms: :func:`program_agrees`); sorted."""
    return sorted(
        pid
        for pid, info in table.items()
        if info.cmdline and executes_script(info.cmdline, script, info.cwd) and program_agrees(info)
    )


def lookalike_reason(info: ProcInfo) -> str | None:
    """Why a process matched by a raw pattern only names the script (a pager, editor, grep, ssh ...), or None."""
    for name in (program_name(info.cmdline), info.name):
        if name in LOOKALIKE_PROGRAMS:
            return f"{name} only names the script, it does not run it"
    name = program_name(info.cmdline)
    if is_interpreter(name) and info.cmdline[1:2] and info.cmdline[1].startswith("-c"):
        return f"{name} -c only names the script in its arguments, it does not run it"
    return None


def user_matches(info: ProcInfo, user: str | None) -> bool:
    """``user`` given as a name or a numeric uid; no ``user`` matches everyone."""
    if not user:
        return True
    return info.username == user or (info.uid is not None and str(info.uid) == user)


def build_tree(
    table: dict,
    selected: list,
    protected: dict,
    launcher_re: re.Pattern | None = None,
    user: str | None = None,
) -> Tree:
    """Expand selected pids into the whole run.

    * Protected processes (see :func:`protection_reason`) and processes of another ``user`` are dropped and
      listed in ``excluded``; a protected process's subtree is never entered.
    * Each selected process's parent joins as a ``launcher`` while its command line matches ``launcher_re``
      (torchrun, ``python -m torch.distributed.run``, deepspeed, accelerate); the walk continues upwards
      through launchers and matched processes and stops at the first other process.
    * Zombies (already exited, waiting to be reaped) are listed in ``excluded``, never members.
    * Every descendant of the resulting tops joins (``child``), so all workers of a launcher are included even
      when only one worker was selected.
    """
    tree = Tree(matched=list(selected))
    excluded: dict = {}

    def allowed(pid: int) -> bool:
        info = table.get(pid)
        if info is None:
            return False
        reason = protection_reason(info, protected)
        if reason is None and not user_matches(info, user):
            reason = f"owned by {info.username or '?'}, not by user {user}"
        if reason is None and info.status == "zombie":
            reason = "a zombie (already exited, waiting for its parent to reap it)"
        if reason is not None:
            excluded.setdefault(pid, reason)
            return False
        return True

    selected_ok = [pid for pid in selected if allowed(pid)]
    selected_set = set(selected_ok)
    launchers: set = set()
    if launcher_re is not None:
        for pid in selected_ok:
            parent = table[pid].ppid
            while parent in table and parent not in launchers:
                pinfo = table[parent]
                if parent in selected_set:
                    parent = pinfo.ppid  # walk through matched parents towards their launcher
                    continue
                if not (pinfo.cmdline and launcher_re.search(pinfo.cmdline_str)):
                    break
                if protection_reason(pinfo, protected) is not None:
                    break  # a launcher that is also protected (e.g. our own ancestor) stops the walk
                if not allowed(parent):
                    break
                launchers.add(parent)
                parent = pinfo.ppid

    core = selected_set | launchers
    tops = sorted(pid for pid in core if not any(a in core for a in ancestors(table, pid)))
    kids = children_map(table)
    order: list = []
    seen: set = set()
    # breadth-first over all tops together: launchers/roots first, then children level by level
    queue = list(tops)
    while queue:
        pid = queue.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        if pid not in core and not allowed(pid):
            continue  # skip the protected process and its whole subtree
        order.append(pid)
        queue.extend(kids.get(pid, []))

    in_tree = set(order)
    for pid in order:
        if pid in launchers:
            role = ROLE_LAUNCHER
        elif pid in selected_set and not any(a in selected_set and a in in_tree for a in ancestors(table, pid)):
            role = ROLE_ROOT
        else:
            role = ROLE_CHILD
        tree.roles[pid] = role
    tree.members = [table[pid] for pid in order]
    tree.excluded = [
        {
            "pid": pid,
            "reason": reason,
            "name": table[pid].name if pid in table else "",
            "cmdline": table[pid].cmdline_str if pid in table else "",
        }
        for pid, reason in sorted(excluded.items())
    ]
    return tree


def pids_on_gpus(gpus: list, pids: list) -> list:
    """Compute processes of ``pids`` still listed on any GPU (``gpus`` as returned by ``_nvidia.read_gpus``)."""
    wanted = set(pids)
    found = []
    for gpu in gpus or []:
        for proc in gpu.get("compute_processes") or []:
            try:
                pid = int(proc.get("pid"))
            except (TypeError, ValueError):
                continue
            if pid in wanted:
                found.append(
                    {
                        "pid": pid,
                        "gpu_index": gpu.get("index"),
                        "gpu_uuid": gpu.get("uuid"),
                        "name": proc.get("name"),
                        "used_mib": proc.get("used_mib"),
                    }
                )
    return found


def signal_number(name: str) -> int:
    """``"SIGTERM"`` -> 15. Raises ValueError naming the valid choices."""
    if name not in SIGNAL_CHOICES or not hasattr(signal, name):
        raise ValueError(f"unknown signal {name!r}; use one of {', '.join(SIGNAL_CHOICES)}")
    return int(getattr(signal, name))


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


# ------------------------------------------------------------------------------------------------------- I/O


def _read_stat(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return parse_proc_stat(handle.read())
    except OSError:
        return None


def _uid_of(uids) -> int | None:
    try:
        return int(uids.real)
    except (AttributeError, TypeError, ValueError):
        return None


def snapshot() -> dict:
    """``{pid: ProcInfo}`` for every process visible now. Needs psutil."""
    table: dict = {}
    attrs = ["pid", "ppid", "name", "username", "uids", "cmdline", "create_time", "status", "cwd", "exe"]
    for proc in psutil.process_iter(attrs=attrs, ad_value=None):
        info = proc.info
        pid = info.get("pid")
        if pid is None:
            continue
        stat = _read_stat(pid)
        table[pid] = ProcInfo(
            pid=pid,
            ppid=int(info.get("ppid") or (stat or {}).get("ppid") or 0),
            name=info.get("name") or (stat or {}).get("comm") or "",
            username=info.get("username") or "",
            cmdline=tuple(info.get("cmdline") or ()),
            create_time=float(info.get("create_time") or 0.0),
            start_ticks=stat["start_ticks"] if stat else None,
            status=info.get("status") or "",
            kernel_thread=bool(stat and stat["flags"] & PF_KTHREAD) or (not stat and pid == 2),
            uid=_uid_of(info.get("uids")),
            cwd=info.get("cwd") or None,
            exe=info.get("exe") or None,
        )
    return table


def read_process(pid: int) -> ProcInfo | None:
    """A one-process snapshot (None when ``pid`` does not exist)."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            stat = _read_stat(pid)
            return ProcInfo(
                pid=pid,
                ppid=proc.ppid(),
                name=proc.name(),
                username=_safe(proc.username, ""),
                cmdline=tuple(_safe(proc.cmdline, ()) or ()),
                create_time=proc.create_time(),
                start_ticks=stat["start_ticks"] if stat else None,
                status=_safe(proc.status, ""),
                kernel_thread=bool(stat and stat["flags"] & PF_KTHREAD),
                uid=_uid_of(_safe(proc.uids, None)),
                cwd=_safe(proc.cwd, None),
                exe=_safe(proc.exe, None) or None,
            )
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def _safe(getter, default):
    try:
        return getter()
    except (psutil.AccessDenied, psutil.ZombieProcess, KeyError):
        return default


def identity_state(info: ProcInfo) -> str:
    """``"alive"``, ``"zombie"``, ``"gone"`` or ``"reused"`` (the pid now belongs to another process)."""
    if info.start_ticks is not None:
        stat = _read_stat(info.pid)
        if stat is None:
            return "gone"
        if stat["start_ticks"] != info.start_ticks:
            return "reused"
        return "zombie" if stat["state"] in ("Z", "X", "x") else "alive"
    try:
        proc = psutil.Process(info.pid)
        if abs(proc.create_time() - info.create_time) > CREATE_TIME_TOLERANCE_S:
            return "reused"
        return "zombie" if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) else "alive"
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return "gone"


def is_gone(info: ProcInfo) -> bool:
    """True once the process no longer runs: exited, reaped, pid reused, or a zombie (holds no resources)."""
    return identity_state(info) != "alive"


def signal_exact(info: ProcInfo, signum: int) -> str:
    """Send ``signum`` to exactly this process; returns ``sent``/``gone``/``reused``/``zombie``/``denied``.

    With a pidfd the identity is checked after the pidfd is open, so the signal cannot reach a process that
    took over the pid in between.
    """
    pidfd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            pidfd = os.pidfd_open(info.pid)
        except ProcessLookupError:
            return "gone"
        except OSError:
            pidfd = None  # kernel without pidfd support: fall back to kill(2)
    try:
        state = identity_state(info)
        if state != "alive":
            return state
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(info.pid, signum)
        return "sent"
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "denied"
    finally:
        if pidfd is not None:
            os.close(pidfd)


def probe_permission(members: list) -> list:
    """Members this process may not signal (``kill(pid, 0)`` answers EPERM); sends no signal."""
    denied = []
    for info in members:
        if identity_state(info) != "alive":
            continue
        try:
            os.kill(info.pid, 0)
        except PermissionError:
            denied.append(info)
        except ProcessLookupError:
            continue
    return denied


def new_descendants(alive: list, known: set, protected: dict, user: str | None = None) -> list:
    """Processes that appeared under live members since the snapshot (e.g. a worker a launcher restarted).

    One pass over the process table (pid -> ppid), then a walk down from the live members. New processes
    pass the same protection and user checks as the snapshot; their pids join ``known``.
    """
    parents = {}
    for proc in psutil.process_iter(attrs=["ppid"], ad_value=None):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            parents[proc.pid] = ppid
    kids: dict = {}
    for pid, ppid in parents.items():
        kids.setdefault(ppid, []).append(pid)
    found = []
    queue = [m.pid for m in alive if identity_state(m) == "alive"]
    seen = set(queue)
    while queue:
        for kid in sorted(kids.get(queue.pop(0), [])):
            if kid in seen:
                continue
            seen.add(kid)
            if kid in known:
                queue.append(kid)
                continue
            child = read_process(kid)
            if child is None or protection_reason(child, protected) or not user_matches(child, user):
                continue
            if child.status == "zombie":
                continue
            known.add(kid)
            found.append(child)
            queue.append(kid)
    return found


@dataclass
class HaltResult:
    signals_sent: list = field(default_factory=list)  # [{pid, signal}]
    escalated: bool = False
    survivors: list = field(default_factory=list)  # ProcInfo still alive at the end
    late_members: list = field(default_factory=list)  # ProcInfo that appeared while halting
    skipped: list = field(default_factory=list)  # [{pid, reason}] not signalled (gone, reused, zombie)
    zombies: list = field(default_factory=list)  # pids that ended as zombies (not yet reaped by their parent)
    elapsed_s: float = 0.0  # first signal -> every process gone (or the timeout): ended_at - started_at
    started_at: float = 0.0  # wall clock (epoch s) of the first signal
    ended_at: float = 0.0  # wall clock (epoch s) when every process was gone, or the halt gave up


def halt_tree(
    members: list,
    signum: int,
    timeout: float,
    kill_after: float,
    escalate: bool = True,
    discover=None,
    clock=time.monotonic,
    sleep=time.sleep,
    wall=time.time,
) -> HaltResult:
    """Signal ``members`` top-down, wait up to ``timeout`` seconds, SIGKILL survivors after ``kill_after``.

    ``discover(alive_members) -> list[ProcInfo]`` (optional) returns processes that joined the tree meanwhile;
    they get the signal currently in force. Returns when every member is gone or the timeout passed.
    """
    start = clock()
    result = HaltResult(started_at=wall())
    current = signum

    def send(info: ProcInfo, sig: int) -> None:
        outcome = signal_exact(info, sig)
        if outcome == "sent":
            result.signals_sent.append({"pid": info.pid, "signal": signal_name(sig)})
        else:
            result.skipped.append({"pid": info.pid, "signal": signal_name(sig), "reason": outcome})

    for info in members:
        send(info, current)
    everyone = list(members)
    alive = [m for m in everyone if not is_gone(m)]
    interval = 0.02
    while alive:
        elapsed = clock() - start
        if discover is not None:
            for late in discover(alive):
                result.late_members.append(late)
                everyone.append(late)
                send(late, current)
                alive.append(late)
        if escalate and current != signal.SIGKILL and elapsed >= kill_after:
            current = signal.SIGKILL
            for info in alive:
                send(info, current)
            result.escalated = any(s["signal"] == "SIGKILL" for s in result.signals_sent)
        if elapsed >= timeout:
            break
        wait = min(interval, max(0.0, timeout - elapsed))
        if escalate and current != signal.SIGKILL:
            wait = min(wait, max(0.0, kill_after - elapsed))
        sleep(max(wait, 0.005))
        interval = min(interval * 1.5, 0.25)
        alive = [m for m in alive if not is_gone(m)]
    result.survivors = alive
    result.zombies = sorted(m.pid for m in everyone if identity_state(m) == "zombie")
    elapsed = clock() - start
    # The end on the wall clock is the start plus the monotonic duration: the two times differ by exactly elapsed_s.
    result.ended_at = result.started_at + elapsed
    result.elapsed_s = round(elapsed, 3)
    return result
