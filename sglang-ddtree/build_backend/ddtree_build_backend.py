"""The package's PEP 517 build backend: setuptools' own, with a fallback for a stock controller.

setuptools builds the wheel whenever it can: setuptools >= 77, which has bdist_wheel built in and reads the SPDX
``license`` string of pyproject.toml. A stock Debian 12 ``python3 -m venv`` has pip 23.0.1 and setuptools 66.1.1
and no ``wheel``; ``pip wheel --no-build-isolation`` (how the ddtree_plugin role builds the plugin on the
controller, offline) would fail there ("invalid command 'bdist_wheel'", and setuptools < 77 refuses the SPDX
string). With such a setuptools this module writes the pure-Python wheel itself from pyproject.toml and src/
(metadata 2.1, entry points, RECORD): the same files and metadata setuptools puts in. sdists and editable installs
are setuptools' alone (pip's build isolation brings a current one).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import zipfile
from pathlib import Path

from setuptools import __version__ as _setuptools_version
from setuptools import build_meta as _st

ROOT = Path(__file__).resolve().parent.parent

get_requires_for_build_sdist = _st.get_requires_for_build_sdist
build_sdist = _st.build_sdist
if hasattr(_st, "build_editable"):  # setuptools >= 64
    get_requires_for_build_editable = _st.get_requires_for_build_editable
    prepare_metadata_for_build_editable = _st.prepare_metadata_for_build_editable
    build_editable = _st.build_editable


def _setuptools_builds_wheels() -> bool:
    if os.environ.get("SGLANG_DDTREE_OWN_WHEEL"):  # tests force the fallback
        return False
    return int(re.findall(r"\d+", _setuptools_version)[0]) >= 77


def get_requires_for_build_wheel(config_settings=None):
    return _st.get_requires_for_build_wheel(config_settings) if _setuptools_builds_wheels() else []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    if _setuptools_builds_wheels():
        return _st.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
    project = _project()
    dist_info = Path(metadata_directory) / _dist_info_name(project)
    dist_info.mkdir(parents=True, exist_ok=True)
    for name, text in _metadata_files(project).items():
        (dist_info / name).write_text(text, encoding="utf-8")
    return dist_info.name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    if _setuptools_builds_wheels():
        return _st.build_wheel(wheel_directory, config_settings, metadata_directory)
    return _own_wheel(Path(wheel_directory))


# ---------------------------------------------------------------------------------------------- the fallback wheel
def _project() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        from setuptools.extern import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _dist_info_name(project: dict) -> str:
    return f"{_norm(project['name'])}-{project['version']}.dist-info"


def _metadata_files(project: dict) -> dict[str, str]:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}"]
    if project.get("description"):
        lines.append(f"Summary: {project['description']}")
    lic = project.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append(f"License: {lic['text']}")
    elif isinstance(lic, str):
        lines.append(f"License: {lic}")  # metadata 2.1 has no License-Expression
    if project.get("requires-python"):
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {dep}; extra == "{extra}"' for dep in deps]
    readme = project.get("readme")
    body = ""
    if isinstance(readme, str) and (ROOT / readme).is_file():
        lines.append("Description-Content-Type: text/markdown" if readme.endswith(".md") else "")
        body = "\n" + (ROOT / readme).read_text(encoding="utf-8")
    metadata = "\n".join(line for line in lines if line) + "\n" + body
    entry_points = []
    groups = dict(project.get("entry-points", {}))
    if project.get("scripts"):
        groups = {"console_scripts": project["scripts"], **groups}
    for group, items in groups.items():
        entry_points.append(f"[{group}]")
        entry_points += [f"{name} = {target}" for name, target in items.items()]
        entry_points.append("")
    wheel = "Wheel-Version: 1.0\nGenerator: sglang-ddtree build_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = {"METADATA": metadata, "WHEEL": wheel}
    if entry_points:
        files["entry_points.txt"] = "\n".join(entry_points)
    top_level = sorted(p.name for p in (ROOT / "src").iterdir() if (p / "__init__.py").is_file())
    files["top_level.txt"] = "".join(f"{name}\n" for name in top_level)
    return files


def _own_wheel(wheel_directory: Path) -> str:
    project = _project()
    name = f"{_norm(project['name'])}-{project['version']}-py3-none-any.whl"
    dist_info = _dist_info_name(project)
    src = ROOT / "src"
    files: list[tuple[str, bytes]] = []
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if not path.is_file() or "__pycache__" in rel.parts or rel.suffix in {".pyc", ".pyo"}:
            continue
        if any(part.endswith(".egg-info") for part in rel.parts):
            continue
        files.append((rel.as_posix(), path.read_bytes()))
    files += [(f"{dist_info}/{n}", text.encode()) for n, text in _metadata_files(project).items()]
    record = []
    wheel_directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel_directory / name, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files:
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arcname},sha256={digest},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        zf.writestr(info, "\n".join(record) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    return name
