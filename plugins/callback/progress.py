# Copyright: specdec.pivot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: progress
type: stdout
short_description: the default output, with long waits shown as progress instead of "FAILED - RETRYING"
version_added: 0.1.0
author: specdec.pivot maintainers (@specdec)
description:
  - ansible.builtin.default's output, unchanged, except for the lines a task with C(until)/C(retries) prints while
    it polls (an C(ansible.builtin.async_status) poll of a background job, for example).
  - >-
    The default callback prints each such poll as C(FAILED - RETRYING: [host]: task) and the retries left, which
    reads like an error and does not say how long the wait has run. This callback prints instead
    C(waiting [host]: task - 25 s so far, limit 300 s) and the poll's number (C(poll 6 of 61)).
  - The time so far is measured by the callback itself (a monotonic clock, from the moment the task started on
    that host, or for a loop item, from the end of the previous item). The limit is the task's C(retries) times its
    C(delay), the time after which the loop gives up (not counting the polls' own duration).
  - >-
    It also loads each play's connection plugins once in the controller's main process, at the play's start
    (option O(preload_connections)). Ansible runs every task of every host in a forked worker that imports the
    host's connection plugin unless the main process already has it; for C(community.docker.docker_api) (the
    lab's connection, which imports the Docker SDK's HTTP stack) that import took about 0.1 s of CPU per task,
    even for C(set_fact) and C(assert), which connect to nothing. Output is not affected.
  - >-
    Enable it with C(stdout_callback = specdec.pivot.progress) in ansible.cfg (this collection's own ansible.cfg
    does) or with the environment variable C(ANSIBLE_STDOUT_CALLBACK=specdec.pivot.progress).
extends_documentation_fragment:
  - ansible.builtin.default_callback
  - ansible.builtin.result_format_callback
options:
  interval:
    description:
      - At least this many seconds between two progress lines of one wait on one host; the first poll of a wait
        always prints. C(0) prints every poll, as does C(-v) and above; C(-vvv) also shows each poll's result, as
        the default callback does.
    type: float
    default: 10
    ini:
      - section: callback_progress
        key: interval
    env:
      - name: ANSIBLE_CALLBACK_PROGRESS_INTERVAL
  preload_connections:
    description:
      - Load the connection plugins of each play's hosts (their C(ansible_connection), else the default) in the
        controller's main process when the play starts, so the forked workers do not import them again for every
        task. A name that is a template, or a plugin that does not load, is left to Ansible as usual.
    type: bool
    default: true
    ini:
      - section: callback_progress
        key: preload_connections
    env:
      - name: ANSIBLE_CALLBACK_PROGRESS_PRELOAD_CONNECTIONS
requirements:
  - set as the stdout callback in configuration
"""

import time

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallbackModule
from ansible.plugins.loader import connection_loader


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def format_seconds(seconds: float) -> str:
    """Whole seconds, as the tasks state their limits."""
    return f"{round(seconds)} s"


class CallbackModule(DefaultCallbackModule):
    """ansible.builtin.default with progress lines for polling tasks."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "specdec.pivot.progress"

    def __init__(self, clock=time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        # Per host (a host runs one task at a time, whatever the strategy): (task uuid, when its current wait began)
        # and (task uuid, when its last progress line was printed).
        self._wait_started: dict[str, tuple[str, float]] = {}
        self._last_line: dict[str, tuple[str, float]] = {}
        self._connection_of: dict[str, str] = {}  # host -> the connection plugin loaded for it (preload)

    # --------------------------------------------------------------------------------- connection plugins, once
    def _option(self, name: str, default):
        try:
            return self.get_option(name)
        except KeyError:
            return default

    def preload_connections(self, play) -> list[str]:
        """Load the connection plugins of the play's hosts in this (the controller's main) process; the names
        loaded. Forked workers then find them in sys.modules instead of importing them for each task. Best effort:
        nothing here may fail or change the run."""
        loaded: list[str] = []
        variable_manager = getattr(play, "_variable_manager", None)
        inventory = getattr(variable_manager, "_inventory", None)
        if inventory is None:
            return loaded
        try:
            hosts = inventory.get_hosts(play.hosts)
        except Exception:  # a pattern Ansible itself reports; nothing to preload then
            return loaded
        for host in hosts:
            name = host.get_name()
            if name in self._connection_of:
                continue
            try:
                value = variable_manager.get_vars(host=host, include_hostvars=False).get("ansible_connection")
            except Exception:  # a vars plugin that fails: Ansible reports it at the task
                value = None
            connection = str(value) if value else ("local" if name in C.LOCALHOST else C.DEFAULT_TRANSPORT)
            self._connection_of[name] = connection
            if "{" in connection or connection in loaded:
                continue
            try:
                if connection_loader.get(connection, class_only=True) is not None:
                    loaded.append(connection)
            except Exception:  # Ansible reports a bad connection name itself, at the task
                continue
        return loaded

    def v2_playbook_on_play_start(self, play) -> None:
        if self._option("preload_connections", True):
            loaded = self.preload_connections(play)
            if loaded:
                self._display.vvv(f"progress: connection plugins loaded once for the play: {', '.join(loaded)}")
        super().v2_playbook_on_play_start(play)

    # ------------------------------------------------------------------------------------------------ bookkeeping
    @staticmethod
    def _host_name(host) -> str:
        get_name = getattr(host, "get_name", None)
        return str(get_name() if callable(get_name) else host)

    @staticmethod
    def _result_task(result):
        return getattr(result, "task", None) or getattr(result, "_task", None)

    @staticmethod
    def _task_id(task) -> str:
        return str(getattr(task, "_uuid", id(task)))

    def _key(self, result) -> tuple[str, str]:
        host = getattr(result, "host", None) or getattr(result, "_host", None)
        return self._host_name(host), self._task_id(self._result_task(result))

    def _begin(self, host: str, task_id: str) -> None:
        self._wait_started[host] = (task_id, self._clock())
        self._last_line.pop(host, None)

    def v2_runner_on_start(self, host, task) -> None:
        self._begin(self._host_name(host), self._task_id(task))
        super().v2_runner_on_start(host, task)

    # A loop's next item starts when the previous one ends: its wait is timed from there.
    def v2_runner_item_on_ok(self, result) -> None:
        self._begin(*self._key(result))
        super().v2_runner_item_on_ok(result)

    def v2_runner_item_on_failed(self, result) -> None:
        self._begin(*self._key(result))
        super().v2_runner_item_on_failed(result)

    def v2_runner_item_on_skipped(self, result) -> None:
        self._begin(*self._key(result))
        super().v2_runner_item_on_skipped(result)

    # ---------------------------------------------------------------------------------------------------- the line
    def _limit_s(self, result, attempts_total: int | None) -> float | None:
        """retries x delay: when the until loop gives up (the task's own, templated values)."""
        fields = getattr(result, "task_fields", None) or getattr(result, "_task_fields", None) or {}
        task = self._result_task(result)
        delay = _number(fields.get("delay", getattr(task, "delay", None)))
        if delay is None or attempts_total is None:
            return None
        return max(attempts_total - 1, 0) * delay

    def _interval(self) -> float:
        try:
            return max(float(self.get_option("interval")), 0.0)
        except (KeyError, TypeError, ValueError):
            return 10.0

    def progress_line(self, result) -> str | None:
        """The progress line for this poll, or None when it is too soon after the last one."""
        host, task_id = self._key(result)
        now = self._clock()
        if self._wait_started.get(host, ("", 0.0))[0] != task_id:  # no start seen for this task: from this poll
            self._begin(host, task_id)
        started = self._wait_started[host][1]
        data = result.result if hasattr(result, "result") else result._result
        attempts = data.get("attempts")
        attempts_total = data.get("retries")  # every attempt of the until loop, the first included
        every_poll = self._display.verbosity >= 1 or self._interval() == 0
        last = self._last_line.get(host)
        if last is not None and last[0] == task_id and not every_poll and now - last[1] < self._interval():
            return None
        self._last_line[host] = (task_id, now)
        limit = self._limit_s(result, attempts_total)
        polls = f"poll {attempts}" + (f" of {attempts_total}" if attempts_total else "") if attempts else ""
        return "waiting [{host}]: {task} - {elapsed} so far{limit}{polls}".format(
            host=self.host_label(result),
            task=result.task_name or self._result_task(result),
            elapsed=format_seconds(now - started),
            limit=f", limit {format_seconds(limit)}" if limit is not None else "",
            polls=f" ({polls})" if polls else "",
        )

    def v2_runner_retry(self, result) -> None:
        msg = self.progress_line(result)
        if msg is None:
            return
        if self._run_is_verbose(result, verbosity=2):
            data = result.result if hasattr(result, "result") else result._result
            msg += f" Result was: {self._dump_results(data)}"
        self._display.display(msg, color=C.COLOR_DEBUG)
