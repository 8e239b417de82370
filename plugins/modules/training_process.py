#!/usr/bin/python
# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: training_process
short_description: Find, report and halt a training run's whole process tree
version_added: "0.1.0"
description:
  - Finds a training run on the target host by the script it executes (O(script)), by a pid, or (expert) by a
    regular expression on the full command line, and expands it to the whole run - the matched processes,
    every descendant (all workers), and the launcher
    parent (C(torchrun), C(python -m torch.distributed.run), deepspeed, accelerate) when it is part of the run.
  - With O(state=present) it only reports the tree. With O(state=absent) it halts the run - sends O(signal) to
    every process of the tree top-down (launchers first so a launcher stops supervising and cannot restart
    workers, then the roots, then their descendants breadth-first), waits up to O(timeout) seconds, sends
    C(SIGKILL) to whatever is still alive after O(kill_after) seconds (when O(escalate=true)), and proves that
    every process is gone. Children that appear under the tree while it halts (a worker restart racing the halt)
    join the tree and are signalled too.
  - Never selects the module's own process, its ancestors (the Ansible connection, sudo, sshd) or its children,
    PID 1, kernel threads, Ansible processes, zombies, or system programs such as sshd, systemd, sudo, su,
    tmux and screen. A pattern that matches them lists them under RV(excluded) with the reason.
  - Each process is signalled by its exact identity (pid and start time from C(/proc/<pid>/stat)); where the
    kernel supports pidfds the identity is checked on an open pidfd and the signal goes through it, so a pid
    that was reused by another process is never signalled.
  - Optionally reads the tail of the training log (last step, throughput in tokens/s, loss), the newest
    checkpoint, and waits until no halted pid is listed as a compute process on any NVIDIA GPU. The log and
    the checkpoint are read after the halt, so a checkpoint written on SIGTERM is reported.
author:
  - specdec.pivot maintainers (@specdec)
requirements:
  - psutil (on the target host)
  - Linux for exact process identity and kernel-thread detection (C(/proc)); other POSIX systems fall back to
    psutil's create_time
options:
  script:
    description:
      - The training script. A process belongs to the run when it B(executes) the script - an interpreter
        (C(python), C(python3), C(python3.11), C(pypy3)) whose script argument is it, or a launcher whose
        launched script is it (C(torchrun), C(python -m torch.distributed.run), C(torch.distributed.launch),
        C(accelerate launch), C(deepspeed), also as C(python /path/torchrun) and through C(--no-python)) - plus
        that process's whole tree (every descendant, and launcher parents).
      - A process that only names the script is never part of the run - C(less), C(vim), C(grep), C(tail -f),
        C(watch), an C(ssh) client, C(python -c '...' train.py), C(python other.py train.py). C(argv[0]) is not
        trusted alone (a parent may set it to anything, as in C(exec -a python3 less train.py)), so the process's
        executable must be a Python interpreter or the program C(argv[0]) names.
      - A bare file name (C(train_dflash_pipeline.py)) matches the script in any directory; a path matches that
        path only (a relative script argument is resolved against the process's working directory).
      - Mutually exclusive with O(pattern) and O(pid); one of the three is required.
    type: str
  pattern:
    description:
      - Expert option, prefer O(script). Python regular expression searched (C(re.search)) in each process's full
        command line, the argv joined with single spaces.
      - A pattern matches every command line that contains it, so it can select a pager, an editor or a C(grep)
        of the script; the module warns whenever it is used, and leaves out matched processes whose program only
        names files (C(less), C(vim), C(grep), C(tail), C(watch), C(ssh), C(python -c), ...; see RV(excluded)).
      - Processes without a command line (kernel threads, zombies) never match.
      - Refused with an error, before anything is signalled, when it cannot stand for one training run - a
        catch-all (C(.), C(.*), one that matches the empty string or any common command line), one that matches a
        process that is never signalled (PID 1, sshd, sudo, an Ansible process, the module itself or its
        ancestors - the controller's own processes where it runs on the host), or processes of several users
        without O(user).
      - Mutually exclusive with O(script) and O(pid).
    type: str
  pid:
    description:
      - Pid of one process of the run (the launcher or any worker). The whole tree is derived from it as for
        O(pattern).
      - When the pid does not exist the run counts as already stopped.
      - Refused with an error when the pid is protected (PID 1, the module's own ancestors, sshd, ...).
    type: int
  pid_create_time:
    description:
      - Expected C(create_time) of O(pid) (seconds since the epoch, as returned in RV(processes)). When the
        process with that pid started at another time (more than 1 second apart), the pid was reused by an
        unrelated process and the run counts as already stopped; nothing is signalled.
      - Use it to halt exactly the run an earlier O(state=present) task reported.
    type: float
  user:
    description:
      - Only processes owned by this user (name or numeric uid). Members of the tree owned by someone else
        are left alone and listed in RV(excluded).
      - A user name that does not exist on the host is an error (not an already stopped run).
    type: str
  state:
    description:
      - V(present) reports the run without touching it (a query; never changes anything).
      - V(absent) halts the run and proves every process of it is gone.
    type: str
    choices: [absent, present]
    default: present
  signal:
    description:
      - First signal sent to every process of the tree when O(state=absent).
    type: str
    choices: [SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGKILL, SIGUSR1, SIGUSR2]
    default: SIGTERM
  timeout:
    description:
      - Like every time option (O(kill_after), O(gpu_release_timeout), O(gpu_query_timeout), O(pid_create_time)),
        a finite number; C(nan) and C(inf) are refused.
      - Seconds to wait in total for the whole tree to exit, the C(SIGKILL) phase included.
      - When processes are still alive after it, the module fails and lists them in RV(survivors).
    type: float
    default: 120.0
  kill_after:
    description:
      - Seconds after the first signal before survivors get C(SIGKILL) (when O(escalate=true)).
      - Must be less than O(timeout) when O(escalate=true). Give a run that saves a checkpoint on SIGTERM
        enough time to finish the save.
    type: float
    default: 90.0
    aliases: [grace]
  escalate:
    description:
      - Send C(SIGKILL) to survivors after O(kill_after) seconds. With V(false) survivors make the module fail.
    type: bool
    default: true
  max_processes:
    description:
      - Refuse to halt (fail without signalling anything) when the tree has more processes than this; a
        pattern that wide probably matches more than the training run.
      - With O(state=present) a wider tree is reported with a warning.
    type: int
    default: 64
  include_launcher:
    description:
      - Add the parent of a matched process to the tree while its command line matches O(launcher_regex),
        walking upwards through launchers and matched processes.
    type: bool
    default: true
  launcher_regex:
    description:
      - Regular expression that recognises a launcher's command line (see O(include_launcher)).
      - The default recognises C(torchrun), C(deepspeed), C(accelerate) as a program or script name and
        C(python -m torch.distributed.run), C(torch.distributed.launch), C(deepspeed.launcher.launch),
        C(accelerate.commands.launch).
    type: str
    default: "(?:^|[\\s/])(?:torchrun|deepspeed|accelerate)(?:\\s|$)|-m\\s+(?:torch\\.distributed\\.(?:run|launch)\
      |deepspeed\\.launcher\\.launch|accelerate\\.commands\\.launch)(?:\\s|$)"
  log_path:
    description:
      - Training log to read after the halt (or now, with O(state=present)). Its last O(log_lines) lines are
        returned and parsed for the last step, throughput and loss.
      - A missing or unreadable log is a warning, not a failure; so is a path that is not a regular file (a FIFO, a
        device), which is never opened for a blocking read. At most its last MiB is read.
    type: path
  log_lines:
    description:
      - How many lines of the log tail to return and parse (1 to 10000).
    type: int
    default: 20
  step_regex:
    description:
      - Regular expression for the step number; its first group that matched is the step. The newest line
        that matches gives RV(log.last_step) and RV(log.line).
    type: str
    default: "(?i)(?<![a-z])step(?![a-z])[\\s:=#_]*(\\d+)"
  throughput_regex:
    description:
      - Regular expression for the throughput. The first group that holds a number is the value; the group
        right after it, when present, is a unit suffix C(K), C(M) or C(G) (case-insensitive, x1e3, x1e6, x1e9).
      - The default reads C(19.5K tok/s), C(19500 tokens/s), C(1,234 tok/sec) and C(tok/s= 19.5K).
    type: str
    default: "(?i)(\\d{1,3}(?:,\\d{3})+(?:\\.\\d+)?|\\d+(?:\\.\\d+)?)\\s*([kmg]?)\\s*tok(?:en)?s?\\s*/\\s*s(?:ec(?\
      :ond)?)?(?![a-z])(?!\\s*[:=])|tok(?:en)?s?\\s*/\\s*s(?:ec(?:ond)?)?(?![a-z])\\s*[:=]?\\s*(\\d{1,3}(?\
      :,\\d{3})+(?:\\.\\d+)?|\\d+(?:\\.\\d+)?)\\s*([kmg]?)"
  loss_regex:
    description:
      - Regular expression for the loss; its first group that matched is the value. The first loss of the
        newest line that has one wins. C(nan) and C(inf) are returned as RV(log.loss_text) with RV(log.loss)
        null.
    type: str
    default: "(?i)(?<![a-z])loss(?![a-z])[\\s:=]*([-+]?(?:\\d+(?:\\.\\d*)?|\\.\\d+)(?:e[-+]?\\d+)?|nan|[-+]?inf)"
  checkpoint_dir:
    description:
      - Directory holding the run's checkpoints; the newest entry matching O(checkpoint_glob) (by
        modification time) is returned as RV(checkpoint).
      - A missing or unreadable directory is a warning, not a failure.
    type: path
  checkpoint_glob:
    description:
      - Shell glob, relative to O(checkpoint_dir), of the entries (files or directories) that are checkpoints.
        The default (names with a digit) skips helper files such as C(latest) or C(config.json).
      - It never leaves O(checkpoint_dir) - an absolute glob or one with a C(..) part is refused, and entries that
        are symbolic links out of the directory are not reported.
    type: str
    default: '*[0-9]*'
  wait_gpu_release:
    description:
      - After the halt, wait until none of the halted pids is listed as a compute process on any NVIDIA GPU
        (read through NVML or C(nvidia-smi), the same code as P(specdec.pivot.gpu_memory#module)).
      - A host without an NVIDIA GPU or driver reports the check as skipped with the reason. A hanging
        C(nvidia-smi), a driver/library mismatch, or pids still listed after O(gpu_release_timeout) fail.
      - Inside a container with its own pid namespace the GPU lists host pids, which never equal the
        container's pids; run the module on the host for a meaningful check.
    type: bool
    default: false
  gpu_release_timeout:
    description:
      - Seconds to wait for the GPUs to release the halted pids (O(wait_gpu_release)).
    type: float
    default: 60.0
  settle:
    description:
      - With O(state=absent), after a halt that signalled the run (and the GPU-release wait), wait this many
        seconds and look again with the same match. Whatever matches then came back (a supervisor restarts the
        run) and is returned as RV(came_back), not signalled. V(0) does not look again.
    type: float
    default: 0.0
  nvidia_smi:
    description:
      - Path or name (looked up in E(PATH)) of the C(nvidia-smi) executable used when NVML is not available.
    type: str
    default: nvidia-smi
  gpu_backend:
    description:
      - How the GPU-release check reads the GPUs. V(auto) uses NVML (nvidia-ml-py) when it is importable and
        initialises, else C(nvidia-smi); V(nvml) and V(nvidia-smi) force one.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  gpu_query_timeout:
    description:
      - Seconds one GPU query (one C(nvidia-smi) run) may take before it is killed and the check fails;
        C(nvidia-smi) hangs when the driver is wedged.
    type: float
    default: 15.0
extends_documentation_fragment:
  - specdec.pivot.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports the tree it would signal (RV(pids), RV(processes)) with C(changed=true) when something matched,
        and signals nothing.
  diff_mode:
    support: full
    details:
      - The diff is the list of running pids of the run before and after (C(running_pids)); that is the only
        state the module changes.
notes:
  - The module only signals processes it found in this task's snapshot, by exact identity; it never signals a
    process group or a pid it did not see.
  - Needs the right to signal the processes (the same user, or C(become=true)). Before sending any
    signal it checks every member with C(kill(pid, 0)) and fails without touching anything when one is denied.
  - A zombie (exited, waiting for its parent to reap it) holds no memory or GPU and counts as gone.
seealso:
  - module: specdec.pivot.gpu_memory
"""

EXAMPLES = r"""
- name: Report the drafter's training run (nothing is touched)
  specdec.pivot.training_process:
    script: train_dflash_pipeline.py
    log_path: /data/runs/dflash/train.log
    checkpoint_dir: /data/runs/dflash/checkpoints
  register: training

- name: Halt it - SIGTERM, SIGKILL after 5 minutes, wait until the GPUs are free
  specdec.pivot.training_process:
    script: /data/runs/dflash/train_dflash_pipeline.py
    user: trainer
    state: absent
    kill_after: 300
    timeout: 360
    log_path: /data/runs/dflash/train.log
    checkpoint_dir: /data/runs/dflash/checkpoints
    checkpoint_glob: 'step_*'
    wait_gpu_release: true
  become: true
  register: halted

- name: Show where training stopped
  ansible.builtin.debug:
    msg: >-
      stopped at step {{ halted.log.last_step }} ({{ halted.log.throughput_tok_s }} tok/s),
      newest checkpoint {{ halted.checkpoint.name }}, escalated={{ halted.escalated }}

- name: Halt exactly the tree an earlier query reported, by pid and start time
  specdec.pivot.training_process:
    pid: "{{ training.processes[0].pid }}"
    pid_create_time: "{{ training.processes[0].create_time }}"
    state: absent

- name: What would be signalled (check mode signals nothing)
  specdec.pivot.training_process:
    script: train_dflash_pipeline.py
    state: absent
  check_mode: true
"""

RETURN = r"""
msg:
  description: One-line summary of what was found and done.
  returned: always
  type: str
  sample: "halted 4 processes (pids 4100, 4101, 4102, 4103) with SIGTERM in 0.4s"
found:
  description: Whether a run was found (the tree has at least one process).
  returned: always
  type: bool
  sample: true
pids:
  description: Pids of the tree, in signal order (launchers, roots, then descendants breadth-first).
  returned: always
  type: list
  elements: int
  sample: [4100, 4101, 4102, 4103]
processes:
  description: The processes of the tree as found before anything was signalled, in signal order.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
    ppid:
      description: Parent process id.
      type: int
    name:
      description: Process name.
      type: str
    username:
      description: Owner.
      type: str
    cmdline:
      description: Full command line (argv joined with spaces).
      type: str
    create_time:
      description: Start time, seconds since the epoch (use it as O(pid_create_time)).
      type: float
    status:
      description: psutil status when found (running, sleeping, ...).
      type: str
    role:
      description:
        - V(launcher) - a parent added because it launches the run (torchrun, ...).
        - V(root) - a process O(script), O(pattern) or O(pid) selected whose ancestors in the tree were not selected.
        - V(child) - every other process of the tree.
      type: str
      choices: [launcher, root, child]
  sample:
    - {pid: 4100, ppid: 1, name: torchrun, username: trainer, role: launcher, status: sleeping,
       cmdline: "/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 2 train_dflash_pipeline.py",
       create_time: 1764670000.12}
matched_pids:
  description:
    - Pids O(script), O(pattern) or O(pid) selected before the tree was expanded, protected ones and
      look-alikes included.
  returned: always
  type: list
  elements: int
excluded:
  description: Processes that matched or belong to the tree but are never signalled, and why.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
    reason:
      description: Why it was left alone (the module's own process, an ancestor, PID 1, an Ansible process, ...).
      type: str
    name:
      description: Process name.
      type: str
    cmdline:
      description: Full command line.
      type: str
  sample: [{pid: 3120, reason: "an ancestor of the module's process", name: sshd, cmdline: "sshd: trainer"}]
signals_sent:
  description: Every signal actually delivered, in order.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
    signal:
      description: Signal name.
      type: str
  sample: [{pid: 4100, signal: SIGTERM}, {pid: 4101, signal: SIGTERM}, {pid: 4102, signal: SIGKILL}]
signals_skipped:
  description: >-
    Signals not sent because the process had already exited (V(gone)), was a zombie, or its pid now belonged to
    another process (V(reused)).
  returned: always
  type: list
  elements: dict
  sample: [{pid: 4101, signal: SIGTERM, reason: gone}]
late_pids:
  description: Pids that appeared under the tree while it was halting and were signalled as well.
  returned: always
  type: list
  elements: int
signal_denied:
  description:
    - With O(state=present), the pids of the run this task's user may not signal (C(kill(pid, 0)) answers EPERM;
      no signal is sent), so a later O(state=absent) would fail. Empty with O(state=absent).
  returned: always
  type: list
  elements: int
escalated:
  description: Whether C(SIGKILL) had to be sent after O(kill_after) seconds.
  returned: always
  type: bool
survivors:
  description: Pids still alive when the module gave up (the module fails when this is not empty).
  returned: always
  type: list
  elements: int
  sample: []
zombies:
  description: Pids of the tree that exited but were not yet reaped by their parent (they hold no resources).
  returned: always
  type: list
  elements: int
elapsed_s:
  description:
    - Seconds from the first signal until every process was gone (0 when nothing was signalled); the difference
      of RV(signalled_at) and RV(ended_at).
  returned: always
  type: float
  sample: 0.42
signalled_at:
  description: When the first signal was sent (UTC, the host's clock); null when nothing was signalled.
  returned: always
  type: str
  sample: "2026-12-04T19:57:11.051204Z"
ended_at:
  description:
    - When every process of the run was gone, or the module gave up on survivors (UTC, the host's clock); null when
      nothing was signalled. Taken as RV(signalled_at) plus the monotonic time the halt took, so the two times are
      exactly RV(elapsed_s) apart.
  returned: always
  type: str
  sample: "2026-12-04T19:57:11.473204Z"
log:
  description: The training log's tail and what was parsed from it.
  returned: when O(log_path) is set
  type: dict
  contains:
    path:
      description: The log path.
      type: str
    tail:
      description: The last O(log_lines) lines (progress-bar carriage returns and ANSI colours removed).
      type: list
      elements: str
    last_step:
      description: Step number from the newest line O(step_regex) matches.
      type: int
    line:
      description: The line RV(log.last_step) came from.
      type: str
    throughput_tok_s:
      description: Tokens per second from the newest line O(throughput_regex) matches, suffixes applied.
      type: float
    loss:
      description: Loss from the newest line O(loss_regex) matches (null for nan/inf).
      type: float
    loss_text:
      description: The loss as written in the log (V(nan) included).
      type: str
    mtime:
      description: Modification time of the log (seconds since the epoch).
      type: float
    age_s:
      description: Seconds since the log was last written.
      type: float
    error:
      description: Why the log could not be read (only when it could not).
      type: str
  sample:
    path: /data/runs/dflash/train.log
    tail: ["step 5380 | lr 1.0e-04 | 19.5K tok/s | loss 1.2340"]
    last_step: 5380
    line: "step 5380 | lr 1.0e-04 | 19.5K tok/s | loss 1.2340"
    throughput_tok_s: 19500.0
    loss: 1.234
    loss_text: "1.2340"
    mtime: 1764670100.5
    age_s: 0.8
checkpoint:
  description: The newest checkpoint in O(checkpoint_dir).
  returned: when O(checkpoint_dir) is set
  type: dict
  contains:
    dir:
      description: The checkpoint directory.
      type: str
    path:
      description: Path of the newest matching entry (null when none matched).
      type: str
    name:
      description: Its base name.
      type: str
    step:
      description: The last number in its name (C(checkpoint-5380) gives 5380).
      type: int
    mtime:
      description: Its modification time (seconds since the epoch).
      type: float
    mtime_iso:
      description: The same time in ISO 8601, UTC.
      type: str
    age_s:
      description: Seconds since it was modified.
      type: float
    count:
      description: How many entries matched O(checkpoint_glob).
      type: int
    error:
      description: Why the directory could not be read (only when it could not).
      type: str
  sample: {dir: /data/runs/dflash/checkpoints, path: /data/runs/dflash/checkpoints/checkpoint-5000,
           name: checkpoint-5000, step: 5000, mtime: 1764669000.0, mtime_iso: "2025-12-02T10:30:00+00:00",
           age_s: 1100.5, count: 5}
came_back:
  description:
    - With O(settle) and a halt that signalled the run, what matched again O(settle) seconds after it (pids and
      processes, as RV(pids) and RV(processes)). Any pid there means something restarts the run. Null when
      nobody looked.
  returned: always
  type: dict
  sample: {settle_s: 2.0, pids: [], processes: []}
gpu:
  description: The GPU-release check.
  returned: always
  type: dict
  contains:
    checked:
      description: Whether the GPUs were queried.
      type: bool
    released:
      description: True when no halted pid is listed on any GPU; null when not checked.
      type: bool
    skipped_reason:
      description: Why the check did not run (not requested, check mode, nothing halted, no NVIDIA GPU).
      type: str
    still_on_gpu:
      description: Halted pids still listed as compute processes (pid, gpu_index, gpu_uuid, name, used_mib).
      type: list
      elements: dict
    gpu_count:
      description: Number of GPUs seen.
      type: int
    waited_s:
      description: Seconds spent waiting for the release.
      type: float
    error:
      description: Why the GPUs could not be read (only when the check failed, e.g. a hanging C(nvidia-smi)).
      type: str
    error_kind:
      description: The class of that failure (V(timeout), V(driver_mismatch), V(other)).
      type: str
  sample: {checked: false, released: null, skipped_reason: "no NVIDIA GPU: nvidia-smi not found", still_on_gpu: []}
"""

import datetime
import math
import os
import pwd
import re
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.specdec.pivot.plugins.module_utils import _procs, _training_log
from ansible_collections.specdec.pivot.plugins.module_utils._nvidia import BACKENDS, GpuQueryError, read_gpus

GPU_SKIP_KINDS = ("no_gpu", "no_devices")

ARGUMENT_SPEC = dict(
    script=dict(type="str"),
    pattern=dict(type="str"),
    pid=dict(type="int"),
    pid_create_time=dict(type="float"),
    user=dict(type="str"),
    state=dict(type="str", choices=["absent", "present"], default="present"),
    signal=dict(type="str", choices=list(_procs.SIGNAL_CHOICES), default="SIGTERM"),
    timeout=dict(type="float", default=120.0),
    kill_after=dict(type="float", default=90.0, aliases=["grace"]),
    escalate=dict(type="bool", default=True),
    max_processes=dict(type="int", default=64),
    include_launcher=dict(type="bool", default=True),
    launcher_regex=dict(type="str", default=_procs.DEFAULT_LAUNCHER_REGEX),
    log_path=dict(type="path"),
    log_lines=dict(type="int", default=20),
    step_regex=dict(type="str", default=_training_log.DEFAULT_STEP_REGEX),
    throughput_regex=dict(type="str", default=_training_log.DEFAULT_THROUGHPUT_REGEX),
    loss_regex=dict(type="str", default=_training_log.DEFAULT_LOSS_REGEX),
    checkpoint_dir=dict(type="path"),
    checkpoint_glob=dict(type="str", default=_training_log.DEFAULT_CHECKPOINT_GLOB),
    wait_gpu_release=dict(type="bool", default=False),
    gpu_release_timeout=dict(type="float", default=60.0),
    nvidia_smi=dict(type="str", default="nvidia-smi"),
    gpu_backend=dict(type="str", choices=list(BACKENDS), default="auto"),
    gpu_query_timeout=dict(type="float", default=15.0),
    settle=dict(type="float", default=0.0),
)


def compile_option(module: AnsibleModule, option: str, min_groups: int = 0):
    """Compile the regex in ``option`` or fail naming the option, the value and the fix."""
    value = module.params[option]
    if value is None:
        return None
    if value == "":
        module.fail_json(msg=f"{option} is empty; give a regular expression (for example 'train_dflash_pipeline\\.py')")
    try:
        compiled = re.compile(value)
    except re.error as err:
        module.fail_json(
            msg=(
                f"{option}={value!r} is not a valid Python regular expression: {err}. Fix the expression "
                f"(escape literal characters such as '.', '(' or '[' with a backslash)."
            )
        )
    if compiled.groups < min_groups:
        module.fail_json(
            msg=(
                f"{option}={value!r} has no capture group; put parentheses around the number to extract, "
                f"for example {ARGUMENT_SPEC[option]['default']!r}."
            )
        )
    return compiled


#: The options that are numbers of seconds (or a time stamp): each must be a finite number.
TIME_OPTIONS = ("timeout", "kill_after", "gpu_release_timeout", "gpu_query_timeout", "pid_create_time", "settle")


def validate(module: AnsibleModule) -> None:
    params = module.params
    for option in TIME_OPTIONS:
        if params[option] is not None and not math.isfinite(params[option]):
            module.fail_json(msg=f"{option}={params[option]} is not a finite number; give a number of seconds.")
    if params["pid"] is not None and params["pid"] <= 0:
        module.fail_json(msg=f"pid={params['pid']} is not a process id; give the pid (> 0) of a training process.")
    if params["pid_create_time"] is not None and params["pid"] is None:
        module.fail_json(msg="pid_create_time is set without pid; set pid too, or drop pid_create_time.")
    if params["timeout"] <= 0:
        module.fail_json(msg=f"timeout={params['timeout']} must be > 0 seconds; for example timeout=120.")
    if params["kill_after"] < 0:
        module.fail_json(msg=f"kill_after={params['kill_after']} must be >= 0 seconds; for example kill_after=90.")
    if (
        params["state"] == "absent"
        and params["escalate"]
        and params["signal"] != "SIGKILL"
        and params["kill_after"] >= params["timeout"]
    ):
        module.fail_json(
            msg=(
                f"kill_after={params['kill_after']} must be less than timeout={params['timeout']} when "
                f"escalate=true, or SIGKILL could never be sent; raise timeout (e.g. to "
                f"{params['kill_after'] + 30:g}) or lower kill_after."
            )
        )
    if params["max_processes"] < 1:
        module.fail_json(msg=f"max_processes={params['max_processes']} must be >= 1; the default is 64.")
    if not 1 <= params["log_lines"] <= 10000:
        module.fail_json(msg=f"log_lines={params['log_lines']} must be between 1 and 10000; the default is 20.")
    if params["gpu_release_timeout"] <= 0:
        module.fail_json(
            msg=f"gpu_release_timeout={params['gpu_release_timeout']} must be > 0 seconds; the default is 60."
        )
    if params["settle"] < 0:
        module.fail_json(msg=f"settle={params['settle']} must be >= 0 seconds; the default is 0 (no second look).")
    if params["gpu_query_timeout"] <= 0:
        module.fail_json(msg=f"gpu_query_timeout={params['gpu_query_timeout']} must be > 0 seconds; the default is 15.")
    if params["script"] is not None and not params["script"].strip():
        module.fail_json(
            msg="script is empty; give the training script's file name (e.g. 'train_dflash_pipeline.py') or path."
        )
    if params["user"] is not None and not params["user"].strip():
        module.fail_json(msg="user is empty; give a user name or uid, or leave user out to match every user.")
    if params["user"] and not params["user"].isdigit():
        try:
            pwd.getpwnam(params["user"])
        except KeyError:
            module.fail_json(
                msg=(
                    f"user={params['user']!r} does not exist on this host, so no process can be matched for it; "
                    "give the name (or uid) of the user the training run runs as, or leave user out."
                )
            )
    if not params["checkpoint_glob"]:
        module.fail_json(msg="checkpoint_glob is empty; give a glob such as '*[0-9]*' or 'checkpoint-*'.")
    problem = _training_log.checkpoint_glob_problem(params["checkpoint_glob"])
    if problem:
        module.fail_json(msg=f"checkpoint_glob={params['checkpoint_glob']!r} {problem}.")


def select(module: AnsibleModule, table: dict, protected: dict, pattern, lookalikes: dict) -> list:
    """Pids selected by script, pattern or pid (before tree expansion).

    Processes a raw pattern matched that only name the script (pagers, editors, grep, ssh, ...) go into
    ``lookalikes`` (pid -> reason) instead.
    """
    params = module.params
    if params["script"] is not None:
        return _procs.match_script(table, params["script"])
    if pattern is not None:
        selected = []
        for pid in _procs.match_cmdline(table, pattern):
            protected_why = _procs.protection_reason(table[pid], protected)
            reason = None if protected_why else _procs.lookalike_reason(table[pid])
            if reason is None:  # protected processes are left to build_tree, which names why
                selected.append(pid)
            else:
                lookalikes[pid] = reason
        return selected
    pid = params["pid"]
    info = table.get(pid)
    if info is None:
        return []
    expected = params["pid_create_time"]
    if expected is not None and abs(info.create_time - expected) > _procs.CREATE_TIME_TOLERANCE_S:
        module.warn(
            f"pid {pid} now belongs to a process started at {info.create_time} (not pid_create_time={expected}): "
            f"the run is gone and the pid was reused by {info.name!r}; nothing is signalled."
        )
        return []
    reason = _procs.protection_reason(info, protected)
    if reason is not None:
        module.fail_json(
            msg=(
                f"pid={pid} ({info.name}: {info.cmdline_str[:200]!r}) is {reason} and is never signalled or "
                f"reported; give the pid of the training process (its launcher or a worker), or use script."
            )
        )
    return [pid]


def read_log(module: AnsibleModule, regexes: dict) -> dict:
    params = module.params
    path = params["log_path"]
    try:
        lines = _training_log.read_tail(path, params["log_lines"])
        mtime = os.stat(path).st_mtime
    except OSError as err:
        module.warn(f"log_path={path!r} could not be read ({err.strerror or err}); the log is not reported.")
        return {
            "path": path,
            "tail": [],
            "last_step": None,
            "line": None,
            "throughput_tok_s": None,
            "loss": None,
            "loss_text": None,
            "mtime": None,
            "age_s": None,
            "error": str(err),
        }
    cleaned = [_training_log.clean_line(line) for line in lines]
    parsed = _training_log.parse_training_log(lines, regexes["step"], regexes["throughput"], regexes["loss"])
    return _training_log.describe_log(path, cleaned, parsed, mtime, time.time())


def read_checkpoint(module: AnsibleModule) -> dict:
    params = module.params
    directory = params["checkpoint_dir"]
    try:
        return _training_log.find_newest_checkpoint(directory, params["checkpoint_glob"])
    except OSError as err:
        module.warn(
            f"checkpoint_dir={directory!r} could not be read ({err.strerror or err}); no checkpoint is reported."
        )
        result = _training_log.describe_checkpoint(directory, [], time.time())
        result["error"] = str(err)
        return result


def utc_iso(epoch: float) -> str:
    """Epoch seconds -> the report's time format (UTC, microseconds, Z)."""
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def wait_gpu_release(module: AnsibleModule, pids: list) -> dict:
    """Poll the GPUs until none of ``pids`` is a compute process; fail on a hang or a timeout."""
    params = module.params
    result = {
        "checked": False,
        "released": None,
        "skipped_reason": None,
        "still_on_gpu": [],
        "gpu_count": None,
        "waited_s": 0.0,
    }
    start = time.monotonic()
    deadline = start + params["gpu_release_timeout"]
    interval = 0.25
    while True:
        try:
            gpus = read_gpus(
                module,
                nvidia_smi=params["nvidia_smi"],
                timeout=params["gpu_query_timeout"],
                backend=params["gpu_backend"],
            )
        except GpuQueryError as err:
            kind = getattr(err, "kind", "other")
            if kind in GPU_SKIP_KINDS:
                result["skipped_reason"] = f"no NVIDIA GPU ({kind}): {err}"
                result["waited_s"] = round(time.monotonic() - start, 3)
                return result
            return {**result, "error": str(err), "error_kind": kind, "waited_s": round(time.monotonic() - start, 3)}
        result["checked"] = True
        result["gpu_count"] = len(gpus)
        still = _procs.pids_on_gpus(gpus, pids)
        result["still_on_gpu"] = still
        now = time.monotonic()
        if not still:
            result["released"] = True
            break
        if now >= deadline:
            result["released"] = False
            break
        time.sleep(min(interval, max(0.0, deadline - now)))
        interval = min(interval * 2, 2.0)
    result["waited_s"] = round(time.monotonic() - start, 3)
    return result


def summary(state: str, check_mode: bool, tree: _procs.Tree, signame: str, halt, found_desc: str) -> str:
    all_pids = tree.pids + ([p.pid for p in halt.late_members] if halt else [])
    count = len(all_pids)
    pids = ", ".join(str(p) for p in all_pids[:16]) + (", ..." if count > 16 else "")
    if not count:
        return f"no running process matches {found_desc}" + (" (already stopped)" if state == "absent" else "")
    if state == "present":
        return f"found {count} processes (pids {pids}) for {found_desc}"
    if check_mode:
        return f"would halt {count} processes (pids {pids}) with {signame} for {found_desc}"
    how = "escalated to SIGKILL" if halt.escalated else f"with {signame}"
    if halt.survivors:
        return f"{len(halt.survivors)} of {count} processes survived {how} after {halt.elapsed_s}s"
    return f"halted {count} processes (pids {pids}) {how} in {halt.elapsed_s}s"


def look_again(module: AnsibleModule, pattern, launcher_re, settle: float) -> dict:
    """After ``settle`` seconds, what the same match selects (a run that came back: something restarts it)."""
    time.sleep(settle)
    table = _procs.snapshot()
    protected = _procs.protected_pids(table, os.getpid())
    tree = _procs.build_tree(table, select(module, table, protected, pattern, {}), protected, launcher_re=launcher_re,
                             user=module.params["user"])
    return {"settle_s": settle, "pids": tree.pids, "processes": tree.processes()}


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=[("script", "pattern", "pid")],
        required_one_of=[("script", "pattern", "pid")],
        required_by={"pid_create_time": "pid"},
        supports_check_mode=True,
    )
    if not _procs.HAS_PSUTIL:
        module.fail_json(msg=missing_required_lib("psutil"), exception=str(_procs.PSUTIL_IMPORT_ERROR))
    validate(module)
    params = module.params
    pattern = compile_option(module, "pattern")
    launcher_re = compile_option(module, "launcher_regex") if params["include_launcher"] else None
    regexes = {
        "step": compile_option(module, "step_regex", 1),
        "throughput": compile_option(module, "throughput_regex", 1),
        "loss": compile_option(module, "loss_regex", 1),
    }
    signame = params["signal"]
    signum = _procs.signal_number(signame)
    if params["script"] is not None:
        found_desc = f"script {params['script']!r}"
    elif pattern is not None:
        found_desc = f"pattern {params['pattern']!r}"
        module.warn(
            f"pattern={params['pattern']!r} is an expert option: it selects every process whose command line "
            "contains it, not only the ones that run the training script. Use script (the script's file name or "
            "path) instead; pagers, editors, grep, tail, watch and ssh that name the script are left out."
        )
    else:
        found_desc = f"pid {params['pid']}"

    table = _procs.snapshot()
    protected = _procs.protected_pids(table, os.getpid())
    if pattern is not None:
        problem = _procs.pattern_problem(table, pattern, protected, params["user"])
        if problem:
            module.fail_json(
                msg=(
                    f"pattern={params['pattern']!r} {problem}: it does not select one training run. Use script "
                    "(the training script's file name or path) instead, or a pattern that only the run's command "
                    "lines contain (and user, for one user's run). Nothing was signalled."
                ),
                changed=False,
            )
    lookalikes: dict = {}
    selected = select(module, table, protected, pattern, lookalikes)
    tree = _procs.build_tree(table, selected, protected, launcher_re=launcher_re, user=params["user"])
    tree.matched = sorted(tree.matched + list(lookalikes))
    tree.excluded = sorted(
        tree.excluded
        + [
            {"pid": pid, "reason": reason, "name": table[pid].name, "cmdline": table[pid].cmdline_str}
            for pid, reason in lookalikes.items()
            if pid not in tree.pids
        ],
        key=lambda e: e["pid"],
    )
    count = len(tree.members)
    if count > params["max_processes"]:
        msg = (
            f"{found_desc} selects {count} processes (with launchers and descendants), more than "
            f"max_processes={params['max_processes']}; give script (the training script) instead of a pattern, "
            f"add user, or raise max_processes if this is right."
        )
        if params["state"] == "absent":
            module.fail_json(
                msg=msg + " Nothing was signalled.",
                pids=tree.pids,
                processes=tree.processes(),
                matched_pids=tree.matched,
                excluded=tree.excluded,
                changed=False,
            )
        module.warn(msg)

    before = tree.pids
    result = dict(
        changed=False,
        found=count > 0,
        pids=before,
        processes=tree.processes(),
        matched_pids=tree.matched,
        excluded=tree.excluded,
        signals_sent=[],
        signals_skipped=[],
        late_pids=[],
        escalated=False,
        survivors=[],
        zombies=[],
        elapsed_s=0.0,
        signalled_at=None,
        ended_at=None,
    )
    gpu = {
        "checked": False,
        "released": None,
        "skipped_reason": "wait_gpu_release is false",
        "still_on_gpu": [],
        "gpu_count": None,
        "waited_s": 0.0,
    }
    halt = None
    failure = None
    if params["state"] == "absent" and count:
        result["changed"] = True
        if module.check_mode:
            gpu["skipped_reason"] = "check mode" if params["wait_gpu_release"] else gpu["skipped_reason"]
        else:
            denied = _procs.probe_permission(tree.members)
            if denied:
                module.fail_json(
                    msg=(
                        "not allowed to signal pids "
                        + ", ".join(f"{d.pid} (user {d.username or d.uid})" for d in denied)
                        + "; run the task with become: true or as the owning user. Nothing was signalled."
                    ),
                    **result,
                )
            known = set(before) | {e["pid"] for e in tree.excluded}
            halt = _procs.halt_tree(
                tree.members,
                signum,
                timeout=params["timeout"],
                kill_after=params["kill_after"],
                escalate=params["escalate"],
                discover=lambda alive: _procs.new_descendants(alive, known, protected, params["user"]),
            )
            result.update(
                signals_sent=halt.signals_sent,
                signals_skipped=halt.skipped,
                late_pids=[p.pid for p in halt.late_members],
                escalated=halt.escalated,
                survivors=[p.pid for p in halt.survivors],
                zombies=halt.zombies,
                elapsed_s=halt.elapsed_s,
                signalled_at=utc_iso(halt.started_at),
                ended_at=utc_iso(halt.ended_at),
            )
            if halt.late_members:
                result["processes"] = result["processes"] + [p.as_dict(_procs.ROLE_CHILD) for p in halt.late_members]
                result["pids"] = result["pids"] + result["late_pids"]
            if halt.survivors:
                if params["escalate"] or signame == "SIGKILL":
                    why = (
                        "; they did not exit even after SIGKILL, so they are in uninterruptible sleep (state D: a "
                        "GPU driver teardown, a hung NFS mount); raise timeout, or look at /proc/<pid>/stack"
                    )
                else:
                    why = "; escalate=false, so no SIGKILL was sent: raise timeout or set escalate=true"
                failure = (
                    f"{len(halt.survivors)} processes of the run are still alive after {halt.elapsed_s}s: pids "
                    + ", ".join(str(p.pid) for p in halt.survivors)
                    + why
                )
                gpu["skipped_reason"] = (
                    "processes of the run survived" if params["wait_gpu_release"] else (gpu["skipped_reason"])
                )
            elif params["wait_gpu_release"]:
                gpu = wait_gpu_release(module, result["pids"])
                if gpu.get("error"):
                    failure = (
                        f"the run was halted, but the GPU-release check failed ({gpu['error_kind']}): {gpu['error']}"
                    )
                elif gpu["released"] is False:
                    failure = (
                        f"the run was halted, but after gpu_release_timeout={params['gpu_release_timeout']}s these "
                        "pids are still listed on the GPU: "
                        + ", ".join(f"{s['pid']} on GPU {s['gpu_index']}" for s in gpu["still_on_gpu"])
                    )
    elif params["wait_gpu_release"]:
        gpu["skipped_reason"] = "nothing was halted" if params["state"] == "absent" else "state=present"
    result["gpu"] = gpu
    result["came_back"] = None
    if halt is not None and failure is None and params["settle"] > 0:
        result["came_back"] = look_again(module, pattern, launcher_re, params["settle"])
    # Whether this process may signal every member (kill(pid, 0); no signal is sent): preflight proves the halt
    # can be done before anything changes anywhere.
    result["signal_denied"] = (
        [d.pid for d in _procs.probe_permission(tree.members)] if params["state"] == "present" else []
    )

    if params["log_path"]:
        result["log"] = read_log(module, regexes)
    if params["checkpoint_dir"]:
        result["checkpoint"] = read_checkpoint(module)

    if params["state"] == "present":
        after = before
    else:  # absent: nothing runs afterwards, except survivors of a failed halt
        after = result["survivors"]
    if module._diff:
        result["diff"] = {
            "before": {"running_pids": before},
            "after": {"running_pids": after},
            "before_header": f"training run ({found_desc})",
            "after_header": f"training run ({found_desc})",
        }
    result["msg"] = summary(params["state"], module.check_mode, tree, signame, halt, found_desc)
    if failure:
        result["msg"] = failure
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
