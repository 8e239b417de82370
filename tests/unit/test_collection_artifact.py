"""The collection artefact and the plugin wheel, as a user gets them.

* ``ansible-galaxy collection build`` of the checkout: galaxy.yml's build_ignore keeps production data, lab build
  outputs, venvs, caches, device bundles, reports and the benchmark scripts out of the tarball, and everything the
  pivot needs (playbooks, roles, plugins, the lab inventory, sglang-ddtree's source and build backend) in. The
  checkout is copied and littered with what a working tree holds, so a missing pattern fails the test.
* sglang-ddtree's wheel builds with a stock ``python3 -m venv`` (its bundled pip and setuptools, no ``wheel``
  package) offline, as the ddtree_plugin role builds it (``pip wheel --no-deps --no-build-isolation``), and holds
  the same files as the wheel setuptools builds where it can.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GALAXY = Path(sys.executable).parent / "ansible-galaxy"

# What a working tree holds besides the tracked files: none of it may reach the artefact.
LITTER = [
    "inventories/production/hosts.yml",  # tracked, too
    ".venv/bin/python",
    ".venv-sglang-0.5.17/pyvenv.cfg",
    ".venv-lint/pyvenv.cfg",
    ".device/wheels/torch-2.9.0-cp311-none-linux_x86_64.whl",
    ".whl/x.whl",
    "lab/.build/mmdebstrap.log",
    "lab/.wheelhouse/sglang-0.5.23-py3-none-any.whl",
    "reports/pivot-report.json",
    "reports/pivot-report.md",
    ".pytest_cache/v/cache/nodeids",
    "sglang-ddtree/.pytest_cache/v/cache/nodeids",
    ".ruff_cache/CACHEDIR.TAG",
    "sglang-ddtree/.ruff_cache/CACHEDIR.TAG",
    ".mypy_cache/CACHEDIR.TAG",
    "plugins/modules/__pycache__/gpu_memory.cpython-311.pyc",
    "sglang-ddtree/src/sglang_ddtree/__pycache__/tree.cpython-311.pyc",
    "sglang-ddtree/src/sglang_ddtree.egg-info/PKG-INFO",
    "sglang-ddtree/build/lib/sglang_ddtree/__init__.py",
    "specdec-pivot-0.0.9.tar.gz",
    "ansible_collections/specdec/pivot/galaxy.yml",
    "tests/output/junit/x.xml",
    ".ansible/collections/x",
]
NEVER = ("inventories/production", ".venv", ".device", ".whl", "lab/.build", "lab/.wheelhouse", "reports", ".ansible",
         "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".egg-info", "sglang-ddtree/build",
         "ansible_collections", "tests/output", ".ci", "bench/gpu", ".git")
REQUIRED = ("MANIFEST.json", "FILES.json", "README.md", "COPYING", "meta/runtime.yml", "playbooks/pivot.yml",
            "playbooks/rollback.yml", "playbooks/status.yml", "playbooks/templates/pivot-report.md.j2",
            "playbooks/schemas/pivot-report.schema.json", "plugins/modules/training_process.py",
            "plugins/modules/sglang_capabilities.py", "plugins/modules/gpu_memory.py",
            "roles/ddtree_plugin/tasks/main.yml", "roles/sglang_service/tasks/main.yml",
            "roles/training_halt/tasks/main.yml", "roles/sglang_preflight/tasks/main.yml",
            "inventories/lab/hosts.yml", "sglang-ddtree/pyproject.toml",
            "sglang-ddtree/build_backend/ddtree_build_backend.py", "sglang-ddtree/src/sglang_ddtree/__init__.py",
            "bench/results/pivot_downtime-lab-2026-12-02.md")


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f and (REPO / f).is_file()]


@pytest.fixture(scope="module")
def artefact(tmp_path_factory) -> list[str]:
    if not GALAXY.exists():
        pytest.fail(f"{GALAXY} is missing (make setup-python)")
    src = tmp_path_factory.mktemp("checkout")
    for rel in _tracked_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    for rel in LITTER:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("litter\n")
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "ANSIBLE_CONFIG": str(src / "ansible.cfg")}
    subprocess.run([str(GALAXY), "collection", "build", "--output-path", str(out), str(src)], check=True,
                   capture_output=True, env=env, cwd=src)
    [tarball] = out.glob("specdec-pivot-*.tar.gz")
    with tarfile.open(tarball) as tar:
        return [m.name.removeprefix("./") for m in tar.getmembers()]


@pytest.mark.parametrize("path", REQUIRED)
def test_the_artefact_holds_what_the_pivot_needs(artefact, path) -> None:
    assert path in artefact


@pytest.mark.parametrize("fragment", NEVER)
def test_the_artefact_leaves_out_working_tree_litter(artefact, fragment) -> None:
    found = [n for n in artefact if fragment in n.split("/") or (fragment.startswith(".") and n.endswith(fragment))
             or n.startswith(fragment + "/") or n == fragment or fragment + "/" in n]
    assert not found, f"{fragment} reached the artefact: {found[:5]}"


def test_the_artefact_leaves_out_litter_files_and_other_tarballs(artefact) -> None:
    leaked = [rel for rel in LITTER if rel in artefact]
    assert not leaked
    assert not [n for n in artefact if n.endswith((".tar.gz", ".whl", ".pyc"))]
    # The benchmark scripts stay out; their results (the README's documentation, small) are in.
    assert not [n for n in artefact if n.startswith("bench/") and n.endswith(".py")]
    assert [n for n in artefact if n.startswith("bench/results/")]


# ------------------------------------------------------------------------------------------------ the plugin wheel
def _wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def _copy_package(dest: Path) -> Path:
    pkg = dest / "sglang-ddtree"
    shutil.copytree(REPO / "sglang-ddtree", pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache", "build",
                                                  "tests"))
    return pkg


def test_the_plugin_wheel_builds_offline_in_a_stock_venv(tmp_path) -> None:
    python3 = shutil.which("python3")
    assert python3, "python3 is missing"
    venv = tmp_path / "stock"
    subprocess.run([python3, "-m", "venv", str(venv)], check=True, capture_output=True)
    py = venv / "bin" / "python"
    freeze = subprocess.run([str(py), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                            check=True).stdout
    pkg = _copy_package(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "SGLANG_DDTREE_"))}
    env["PIP_CONFIG_FILE"] = os.devnull  # no index, no find-links: offline
    proc = subprocess.run([str(py), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-w", str(tmp_path / "out"), str(pkg)], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, f"stock venv ({freeze.split()}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    [wheel] = (tmp_path / "out").glob("sglang_ddtree-*-py3-none-any.whl")
    proc = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], check=False,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = ("import importlib.metadata as m; d = m.distribution('sglang-ddtree'); "
             "print(d.version, sorted(e.name for e in d.entry_points if e.group == 'sglang.srt.plugins'), "
             "sorted(e.name for e in d.entry_points if e.group == 'console_scripts'), d.metadata['License'])")
    out = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert out.split()[0] == "0.1.0" and "['ddtree']" in out and "['sglang-ddtree']" in out
    assert "GPL-3.0-or-later" in out  # one license: galaxy.yml's, COPYING at the repository's root


def test_the_fallback_wheel_holds_what_setuptools_puts_in(tmp_path) -> None:
    pkg = _copy_package(tmp_path)
    built = {}
    for label, extra in (("setuptools", {}), ("own", {"SGLANG_DDTREE_OWN_WHEEL": "1"})):
        env = {**os.environ, **extra}
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "-w", str(tmp_path / label), str(pkg)], check=True, capture_output=True, env=env)
        [built[label]] = (tmp_path / label).glob("*.whl")
    assert built["own"].name == built["setuptools"].name
    own, st = _wheel_names(built["own"]), _wheel_names(built["setuptools"])
    assert own == st, f"only in the fallback: {own - st}; only in setuptools': {st - own}"
    with zipfile.ZipFile(built["own"]) as a, zipfile.ZipFile(built["setuptools"]) as b:
        for name in own:
            if name.endswith(".py") or name.endswith(("entry_points.txt", "top_level.txt")):
                assert a.read(name) == b.read(name), name


def collections_used(text: str) -> set[str]:
    """The collections a task file names through a module's FQCN (``ns.coll.module:`` keys), ansible.builtin and
    this collection left out."""
    found = {m.group(1) for m in re.finditer(r"^\s*-?\s*([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+:", text, re.M)}
    return found - {"ansible.builtin", "specdec.pivot"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- name: x\n  community.general.haproxy:\n    state: drain\n", {"community.general"}),
        ("- ansible.posix.sysctl:\n    name: a\n", {"ansible.posix"}),
        ("- name: x\n  ansible.builtin.uri:\n    url: u\n  specdec.pivot.gpu_memory:\n", set()),
        ("- name: x\n  vars:\n    a: b.c.d\n", set()),
    ],
)
def test_collections_used_reads_module_fqcns(text, expected) -> None:
    assert collections_used(text) == expected


def test_every_collection_the_roles_and_playbooks_use_is_a_declared_dependency() -> None:
    """A module of another collection (community.general.haproxy for the fleet pivot) must be in galaxy.yml's
    dependencies, so ``ansible-galaxy collection install`` of the artefact brings or finds it."""

    declared = set(yaml.safe_load((REPO / "galaxy.yml").read_text()).get("dependencies") or {})
    used: dict[str, list[str]] = {}
    for path in sorted([*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("roles/*/handlers/*.yml"),
                        *REPO.glob("playbooks/*.yml"), *REPO.glob("playbooks/tasks/*.yml")]):
        for name in collections_used(path.read_text()):
            used.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert "community.general" in used, "the fleet pivot's balancer steps use community.general.haproxy"
    missing = {name: files for name, files in used.items() if name not in declared}
    assert not missing, f"used but not declared in galaxy.yml dependencies: {missing}"
