"""A polling task's name states the limit its polls and its background job enforce (issue 26: names said 150 s and
360 s where the polls gave up after 152 s and 420 s).

The limit the progress callback prints is retries x delay (plugins/callback/progress.py); the background job is
ended after its async seconds. Both, and the number the task's name states, are rendered here from the roles' own
YAML (defaults, vars, the includes' vars) for the defaults and for other values, with Jinja and Ansible's filters.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import jinja2
import jinja2.meta
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule as CoreFilters

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"


def load(path: Path):
    return yaml.safe_load(path.read_text())


def env() -> jinja2.Environment:
    e = jinja2.Environment(undefined=jinja2.StrictUndefined)
    e.filters.update({k: v for k, v in CoreFilters().filters().items() if k not in ("default", "d")})
    return e


def resolve(variables: dict) -> dict:
    """Template every string value until none changes (role vars refer to each other, as Ansible resolves them)."""
    e, out = env(), dict(variables)
    for _attempt in range(10):
        changed = False
        for key, value in out.items():
            if isinstance(value, str) and "{{" in value:
                refs = jinja2.meta.find_undeclared_variables(e.parse(value))
                if any(isinstance(out.get(r), str) and "{{" in out[r] for r in refs):
                    continue  # a variable it uses is not resolved yet
                try:
                    rendered = e.from_string(value).render(out).strip()
                except jinja2.UndefinedError:
                    continue
                changed |= rendered != value
                out[key] = rendered
        if not changed:
            break
    return out


def render(text, variables: dict) -> str:
    return env().from_string(str(text)).render(variables).strip()


def named_limit(name: str) -> int:
    found = re.findall(r"limit (\d+) s", name)
    assert len(found) == 1, f"the name should state one limit: {name!r}"
    return int(found[0])


def task(tasks: list, name_part: str) -> dict:
    return next(t for t in tasks if name_part in str(t.get("name", "")))


@pytest.mark.parametrize(
    "overrides",
    [{}, {"training_halt_timeout": 60, "training_halt_kill_after": 10},
     {"training_halt_timeout": 7, "training_halt_wait_gpu_release": False}],
    ids=["defaults", "lab", "odd-no-gpu"],
)
def test_training_halt_wait(overrides):
    role = ROLES / "training_halt"
    v = resolve({**load(role / "defaults/main.yml"), **overrides, **load(role / "vars/main.yml")})
    tasks = load(role / "tasks/main.yml")
    start, poll = task(tasks, "Halt the training run"), task(tasks, "Wait for the training run to exit")
    limit = named_limit(render(poll["name"], v))
    assert int(render(poll["retries"], v)) * int(render(poll["delay"], v)) == limit
    assert int(render(start["async"], v)) == limit
    raw = (int(v["training_halt_timeout"]) + (60 if str(v["training_halt_wait_gpu_release"]) == "True" else 0)
           + float(v["training_halt_settle_s"]) + 30)  # the halt, the GPUs' release, the second look, 30 s to spare
    assert raw <= limit < raw + int(v["training_halt_poll_s"])  # the halt's own budget, rounded up to whole polls


def caller_vars(file: str, script: str) -> dict:
    tasks = load(ROLES / "sglang_service" / "tasks" / file)
    return next(t["vars"] for t in tasks if t.get("ansible.builtin.include_tasks") == "background.yml"
                and t["vars"]["sglang_service_bg_script"] == script)


@pytest.mark.parametrize(
    ("file", "script", "overrides"),
    [("verify.yml", "wait_healthy.py", {}),
     ("verify.yml", "wait_healthy.py", {"sglang_service_health_timeout": 360}),  # the lab's
     ("verify.yml", "wait_healthy.py", {"sglang_service_health_timeout": 7.5, "sglang_service_poll_s": 2}),
     ("restore_apply.yml", "wait_healthy.py", {}),
     ("compare.yml", "generation_probe.py", {}),
     ("prepare.yml", "generation_probe.py", {"sglang_service_baseline_timeout": 45})],
    ids=["health", "health-lab", "health-odd", "restored-health", "probe", "baseline"],
)
@pytest.mark.parametrize("restarts", [False, True], ids=["wait", "restart-then-wait"])
def test_background_waits(file, script, overrides, restarts):
    role = ROLES / "sglang_service"
    base = {**load(role / "defaults/main.yml"), **overrides}
    base["sglang_service_wait_timeout"] = base["sglang_service_health_timeout"]  # switch.yml passes it
    base["pivot_state_dir"] = "/var/lib/specdec-pivot"
    include = caller_vars(file, script)
    base["sglang_service_wait_restarts"] = restarts  # switch.yml: the job reloads and restarts the unit first
    wanted_vars = ("sglang_service_bg_limit_s", "sglang_service_bg_what", "restarts")
    v = resolve({**base, **load(role / "vars/main.yml"), **{k: val for k, val in include.items() if k in wanted_vars}})
    tasks = load(role / "tasks/background.yml")
    start = next(t for t in tasks if "bgjob.py', 'start'" in str(t.get("ansible.builtin.command", {}).get("argv")))
    poll = next(t for t in tasks if "until" in t)
    name = render(poll["name"], v)
    limit = named_limit(name)
    assert int(render(poll["retries"], v)) * int(render(poll["delay"], v)) == limit, name
    assert named_limit(render(start["name"], v)) == limit  # the starting command's name states it too
    # the job's own limit: bgjob.py start JOBS_DIR LIMIT_S WAIT_S -- ... (it ends the job then)
    argv = ast.literal_eval(render(start["ansible.builtin.command"]["argv"], {
        **v, "sglang_service_bg_python": "/usr/bin/python3", "sglang_service_bg_script": script,
        "sglang_service_bg_args": ["ARG"]}))
    assert argv[2:7] == ["start", "/var/lib/specdec-pivot/jobs", str(limit), str(v["sglang_service_bg_wait_s"]), "--"]
    assert argv[7:] == ["/usr/bin/python3", f"/var/lib/specdec-pivot/bin/{script}", "ARG"]
    wanted = float(v["sglang_service_bg_limit_s"])
    assert wanted <= limit < wanted + int(v["sglang_service_poll_s"]), name
