"""The stdout callback specdec.pivot.progress (issue 16, point 7): a polling task's retries read as progress.

ansible.builtin.default prints each poll of an until/retries task as "FAILED - RETRYING: [host]: task (57 retries
left)." This callback prints "waiting [host]: task - 25 s so far, limit 300 s (poll 6 of 61)" instead, with the time
measured by the callback (a fake clock here) and the limit = retries x delay; everything else is the default's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as Default
from ansible_collections.specdec.pivot.plugins.callback import progress

ROOT = Path(__file__).resolve().parents[4]
BIN = Path(sys.executable).parent


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Display:
    def __init__(self, verbosity: int = 0) -> None:
        self.verbosity = verbosity
        self.lines: list[tuple[str, str | None]] = []

    def display(self, msg, color=None, **_kw) -> None:
        self.lines.append((msg, color))


class Host:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name


class Task:
    def __init__(self, name: str, delay=None) -> None:
        self._uuid = str(uuid.uuid4())
        self.name = name
        self.delay = delay
        self.delegate_to = None

    def get_name(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name


class Result:
    """What a callback gets for v2_runner_retry: host, task, the task's (templated) fields, the result."""

    def __init__(self, host: Host, task: Task, attempts: int, retries: int, fields: dict | None = None,
                 data: dict | None = None) -> None:
        self.host, self.task = host, task
        self.task_fields = {"name": task.name, **({"delay": task.delay} if fields is None else fields)}
        self.result = {"attempts": attempts, "retries": retries, **(data or {})}

    @property
    def task_name(self) -> str:
        return str(self.task_fields.get("name", "")) or self.task.get_name()


OPTIONS = {"interval": 10.0, "show_per_host_start": False, "display_ok_hosts": True, "display_skipped_hosts": True,
           "display_failed_stderr": False, "show_custom_stats": False, "show_task_path_on_failure": False,
           "check_mode_markers": False, "result_format": "json", "pretty_results": None}


def make(interval: float = 10.0, verbosity: int = 0):
    clock = Clock()
    cb = progress.CallbackModule(clock=clock)
    cb._plugin_options = dict(OPTIONS, interval=interval)
    cb._display = Display(verbosity)
    return cb, clock, cb._display


HALT = (
    "Wait for the training run to exit and its GPUs to be released - SIGKILL after 10 s; limit 300 s, polled every 5 s"
)


def test_a_poll_names_the_host_the_task_the_time_so_far_and_the_limit() -> None:
    cb, clock, display = make()
    host, task = Host("ct200"), Task(HALT, delay=5)
    cb.v2_runner_on_start(host, task)
    clock.now += 25
    cb.v2_runner_retry(Result(host, task, attempts=6, retries=61))
    assert display.lines == [(f"waiting [ct200]: {HALT} - 25 s so far, limit 300 s (poll 6 of 61)", C.COLOR_DEBUG)]


def test_no_failed_or_retrying_wording() -> None:
    cb, clock, display = make(interval=0)
    host, task = Host("pro6000"), Task("Wait for /health on the host", delay=1)
    cb.v2_runner_on_start(host, task)
    for attempt in range(1, 6):
        clock.now += 1.3
        cb.v2_runner_retry(Result(host, task, attempts=attempt, retries=961))
    text = "\n".join(line for line, _color in display.lines)
    assert len(display.lines) == 5
    assert "FAILED" not in text.upper() and "RETRYING" not in text.upper() and "retries left" not in text
    assert [line.split(" - ")[-1] for line, _color in display.lines] == [
        f"{s} s so far, limit 960 s (poll {n} of 961)" for n, s in ((1, 1), (2, 3), (3, 4), (4, 5), (5, 6))]


def test_the_time_is_per_host_from_that_hosts_task_start() -> None:
    cb, clock, display = make(interval=0)
    task = Task("Wait for /health on the host", delay=2)
    a, b = Host("pro6000"), Host("fleet-b")
    cb.v2_runner_on_start(a, task)
    clock.now += 40
    cb.v2_runner_on_start(b, task)
    clock.now += 2
    cb.v2_runner_retry(Result(a, task, attempts=21, retries=31))
    cb.v2_runner_retry(Result(b, task, attempts=1, retries=31))
    assert [line for line, _color in display.lines] == [
        "waiting [pro6000]: Wait for /health on the host - 42 s so far, limit 60 s (poll 21 of 31)",
        "waiting [fleet-b]: Wait for /health on the host - 2 s so far, limit 60 s (poll 1 of 31)",
    ]


def test_polls_are_shown_at_most_every_interval_the_first_always() -> None:
    cb, clock, display = make(interval=10)
    host, task = Host("ct200"), Task(HALT, delay=2)
    cb.v2_runner_on_start(host, task)
    for attempt in range(1, 13):  # a poll every 2 s: shown at 2 s, 12 s, 22 s
        clock.now += 2
        cb.v2_runner_retry(Result(host, task, attempts=attempt, retries=61))
    assert [line.split(" - ")[-1] for line, _color in display.lines] == [
        "2 s so far, limit 120 s (poll 1 of 61)",
        "12 s so far, limit 120 s (poll 6 of 61)",
        "22 s so far, limit 120 s (poll 11 of 61)",
    ]


def test_verbose_shows_every_poll_and_vvv_the_result() -> None:
    cb, clock, display = make(interval=10, verbosity=1)
    host, task = Host("ct200"), Task(HALT, delay=2)
    cb.v2_runner_on_start(host, task)
    for attempt in (1, 2, 3):
        clock.now += 2
        cb.v2_runner_retry(Result(host, task, attempts=attempt, retries=61, data={"finished": 0}))
    assert len(display.lines) == 3 and "Result was" not in display.lines[0][0]
    display.verbosity = 3
    clock.now += 2
    cb.v2_runner_retry(Result(host, task, attempts=4, retries=61, data={"finished": 0}))
    assert display.lines[-1][0].startswith(f"waiting [ct200]: {HALT} - 8 s so far, limit 120 s (poll 4 of 61)")
    assert "Result was: " in display.lines[-1][0] and '"finished": 0' in display.lines[-1][0]


def test_a_loop_item_is_timed_from_the_end_of_the_previous_item(monkeypatch) -> None:
    monkeypatch.setattr(Default, "v2_runner_item_on_ok", lambda self, result: None)  # its banner needs a real task
    cb, clock, display = make(interval=0)
    host, task = Host("pro6000"), Task("Wait for the plugin's checks", delay=1)
    cb.v2_runner_on_start(host, task)
    clock.now += 30
    cb.v2_runner_item_on_ok(Result(host, task, attempts=3, retries=11, data={"item": "a", "_ansible_item_label": "a"}))
    clock.now += 4
    cb.v2_runner_retry(Result(host, task, attempts=1, retries=11))
    assert display.lines[-1][0].endswith(" - 4 s so far, limit 10 s (poll 1 of 11)")


def test_without_a_task_start_the_wait_is_timed_from_its_first_poll() -> None:
    cb, clock, display = make(interval=0)
    host, task = Host("pro6000"), Task("Wait", delay=3)
    cb.v2_runner_retry(Result(host, task, attempts=1, retries=5))
    clock.now += 3.4
    cb.v2_runner_retry(Result(host, task, attempts=2, retries=5))
    assert [line.split(" - ")[-1] for line, _color in display.lines] == [
        "0 s so far, limit 12 s (poll 1 of 5)", "3 s so far, limit 12 s (poll 2 of 5)"]


def test_another_tasks_start_is_not_this_waits_start() -> None:
    cb, clock, display = make(interval=0)
    host = Host("pro6000")
    cb.v2_runner_on_start(host, Task("Halt", delay=1))
    clock.now += 100
    wait = Task("Wait", delay=1)
    cb.v2_runner_retry(Result(host, wait, attempts=1, retries=5))
    clock.now += 1
    cb.v2_runner_retry(Result(host, wait, attempts=2, retries=5))
    assert [line.split(" - ")[-1] for line, _color in display.lines] == [
        "0 s so far, limit 4 s (poll 1 of 5)", "1 s so far, limit 4 s (poll 2 of 5)"]


@pytest.mark.parametrize(
    ("fields", "task_delay", "expected"),
    [
        ({"delay": "5"}, "{{ training_halt_poll_s }}", ", limit 20 s (poll 2 of 5)"),  # templated field wins
        ({}, 2, ", limit 8 s (poll 2 of 5)"),  # no field: the task's own delay
        ({}, "{{ not_templated }}", " (poll 2 of 5)"),  # unknown: no limit shown rather than a wrong one
    ],
)
def test_the_limit_is_retries_times_the_templated_delay(fields, task_delay, expected) -> None:
    cb, clock, display = make(interval=0)
    host, task = Host("ct200"), Task("Wait", delay=task_delay)
    cb.v2_runner_on_start(host, task)
    clock.now += 7
    cb.v2_runner_retry(Result(host, task, attempts=2, retries=5, fields={"name": "Wait", **fields}))
    assert display.lines == [(f"waiting [ct200]: Wait - 7 s so far{expected}", C.COLOR_DEBUG)]


def test_a_no_log_poll_still_shows_progress() -> None:
    # With no_log the callback gets a censored result: attempts and retries are among the keys kept.
    cb, clock, display = make(interval=0)
    host, task = Host("pro6000"), Task("Baseline - the old server's greedy answers", delay=1)
    cb.v2_runner_on_start(host, task)
    clock.now += 12
    res = Result(host, task, attempts=12, retries=871)
    res.result = {"attempts": 12, "retries": 871, "censored": "the output has been hidden"}
    cb.v2_runner_retry(res)
    assert display.lines[0][0] == (
        "waiting [pro6000]: Baseline - the old server's greedy answers - 12 s so far, limit 870 s (poll 12 of 871)")


def test_every_other_event_is_the_default_callbacks() -> None:
    own = {name for name, value in vars(progress.CallbackModule).items() if callable(value) and name.startswith("v2_")}
    assert own == {"v2_runner_retry", "v2_runner_on_start", "v2_runner_item_on_ok", "v2_runner_item_on_failed",
                   "v2_runner_item_on_skipped", "v2_playbook_on_play_start"}
    for name in ("v2_runner_on_ok", "v2_runner_on_failed", "v2_playbook_on_task_start", "v2_playbook_on_stats",
                 "v2_runner_on_async_poll"):
        assert getattr(progress.CallbackModule, name) is getattr(Default, name)


@pytest.mark.parametrize("event", ["v2_runner_item_on_ok", "v2_runner_item_on_failed", "v2_runner_item_on_skipped"])
def test_the_overridden_events_still_print_what_the_default_prints(monkeypatch, event) -> None:
    seen = []
    monkeypatch.setattr(Default, event, lambda self, result: seen.append(result))
    cb, _clock, _display = make()
    res = Result(Host("ct200"), Task("Loop"), attempts=1, retries=1)
    getattr(cb, event)(res)
    assert seen == [res]


def test_task_start_is_delegated(monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(Default, "v2_runner_on_start", lambda self, host, task: seen.append((host, task)))
    cb, _clock, _display = make()
    host, task = Host("ct200"), Task("Halt")
    cb.v2_runner_on_start(host, task)
    assert seen == [(host, task)]


# ------------------------------------------------------------------------- connection plugins loaded once (issue 26)
class Inventory:
    def __init__(self, hosts: list[Host], fail: bool = False) -> None:
        self.hosts, self.fail = hosts, fail

    def get_hosts(self, pattern):
        if self.fail:
            raise ValueError("bad pattern")
        return self.hosts


class VariableManager:
    def __init__(self, inventory: Inventory, connections: dict) -> None:
        self._inventory, self.connections, self.calls = inventory, connections, []

    def get_vars(self, host, include_hostvars=True):
        self.calls.append(host.get_name())
        value = self.connections.get(host.get_name())
        if isinstance(value, Exception):
            raise value
        return {} if value is None else {"ansible_connection": value}


class Play:
    def __init__(self, variable_manager: VariableManager | None, hosts="all") -> None:
        self._variable_manager, self.hosts = variable_manager, hosts


def test_the_plays_connection_plugins_are_loaded_once_in_the_main_process(monkeypatch) -> None:
    asked = []
    monkeypatch.setattr(progress.connection_loader, "get",
                        lambda name, class_only=False: asked.append(name) or (None if name == "nope" else object))
    hosts = [Host(n) for n in ("ct200", "pro6000", "p2", "tmpl", "bad", "vm", "broken", "localhost")]
    vm = VariableManager(Inventory(hosts), {
        "ct200": "community.docker.docker_api", "pro6000": "community.docker.docker_api",
        "p2": "community.docker.docker_api", "tmpl": "{{ conn }}", "bad": "nope", "vm": None,
        "broken": RuntimeError("vars plugin failed")})
    cb, _clock, _display = make()
    loaded = cb.preload_connections(Play(vm))
    # each name once; a template is left to Ansible; no ansible_connection (or vars that fail): the default
    # transport, localhost: local; a plugin that does not load is not counted and fails nothing here
    assert loaded == ["community.docker.docker_api", C.DEFAULT_TRANSPORT, "local"]
    assert asked == ["community.docker.docker_api", "nope", C.DEFAULT_TRANSPORT, "local"]
    # the next play with the same hosts asks neither the variables nor the loader again
    assert cb.preload_connections(Play(vm)) == [] and asked[4:] == [] and len(vm.calls) == len(hosts)


def test_preloading_never_fails_the_play(monkeypatch) -> None:
    def boom(name, class_only=False):
        raise RuntimeError("cannot load")

    monkeypatch.setattr(progress.connection_loader, "get", boom)
    cb, _clock, _display = make()
    assert cb.preload_connections(Play(None)) == []
    assert cb.preload_connections(Play(VariableManager(Inventory([], fail=True), {}))) == []
    assert cb.preload_connections(Play(VariableManager(Inventory([Host("a")]), {"a": "ssh"}))) == []


@pytest.mark.parametrize(("option", "preloads"), [(True, True), (False, False)])
def test_play_start_preloads_unless_turned_off_and_prints_what_the_default_prints(
        monkeypatch, option, preloads) -> None:
    seen, preloaded = [], []
    monkeypatch.setattr(Default, "v2_playbook_on_play_start", lambda self, play: seen.append(play))
    cb, _clock, _display = make()
    monkeypatch.setattr(cb, "get_option", lambda name: option if name == "preload_connections" else 10)
    monkeypatch.setattr(cb, "preload_connections", lambda play: preloaded.append(play) or [])
    play = Play(None)
    cb.v2_playbook_on_play_start(play)
    assert seen == [play] and preloaded == ([play] if preloads else [])


# ------------------------------------------------------------------------------------------ with ansible itself
def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return dict(env, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".venv" / "collections"), **extra)


def test_ansible_doc_renders_it_with_the_default_callbacks_options() -> None:
    out = subprocess.run([str(BIN / "ansible-doc"), "-t", "callback", "--json", "specdec.pivot.progress"], cwd=ROOT,
                         env=_env(), capture_output=True, text=True, timeout=120, check=True).stdout
    doc = json.loads(out)["specdec.pivot.progress"]["doc"]
    assert doc["type"] == "stdout"
    assert doc["options"]["interval"]["default"] == 10
    assert {"display_ok_hosts", "display_skipped_hosts", "result_format"} <= set(doc["options"])


def test_the_repositorys_ansible_cfg_uses_it_and_a_real_retry_loop_shows_progress(tmp_path) -> None:
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Wait for a file that never comes; limit in s 2\n"
        "      ansible.builtin.stat: {path: /nonexistent/specdec-progress}\n"
        "      register: st\n      until: st.stat.exists\n      retries: 2\n      delay: 1\n"
        "      ignore_errors: true\n"
    )
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
         f"ansible_python_interpreter={sys.executable}", str(play)],
        cwd=ROOT, env=_env(ANSIBLE_CALLBACK_PROGRESS_INTERVAL="0"), capture_output=True, text=True, timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = [ln for ln in out.splitlines() if ln.startswith("waiting [localhost]: ")]
    name = "Wait for a file that never comes; limit in s 2"
    assert [ln.split(" - ")[0] for ln in lines] == [f"waiting [localhost]: {name}"] * 2
    assert lines[0].endswith(", limit 2 s (poll 1 of 3)") and lines[1].endswith(", limit 2 s (poll 2 of 3)"), lines
    assert "FAILED - RETRYING" not in out
    assert "PLAY RECAP" in out  # the rest is the default callback's


def test_a_real_play_loads_its_hosts_connection_plugin_in_the_main_process(tmp_path) -> None:
    """With ansible itself: the play's Play object carries the inventory the callback reads (-vvv names what it
    loaded), and the play's result is unchanged."""
    play = tmp_path / "play.yml"
    play.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n"
                    "    - name: A task that connects to nothing\n      ansible.builtin.set_fact: {x: 1}\n")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    h1: {ansible_connection: local}\n    h2: {ansible_connection: local}\n")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-vvv", "-i", str(inventory), str(play)], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "progress: connection plugins loaded once for the play: local" in out, out[-3000:]
    assert "h1                         : ok=1" in out and "h2                         : ok=1" in out
