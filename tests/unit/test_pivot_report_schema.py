"""playbooks/schemas/pivot-report.schema.json: a valid JSON Schema whose required keys the README documents.

The reports themselves are validated against it by the lab's fault tests (tests/integration/test_pivot_faults.py),
on every report a real run writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "playbooks" / "schemas" / "pivot-report.schema.json").read_text())
README = (REPO / "playbooks" / "README.md").read_text()


def test_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["properties"]["schema"]["const"] == SCHEMA["$id"] == "specdec.pivot/pivot-report/1"


@pytest.mark.parametrize(
    "path",
    [
        [],
        ["properties", "summary"],
        ["properties", "inference", "items", "properties", "service"],
        ["properties", "inference", "items", "properties", "plan"],
    ],
    ids=["top", "summary", "service", "plan"],
)
def test_required_keys_are_documented(path):
    node = SCHEMA
    for key in path:
        node = node[key]
    missing = [k for k in node["required"] if f"`{k}`" not in README]
    assert not missing, f"playbooks/README.md does not name {missing}"


def test_a_report_missing_a_key_or_with_a_wrong_status_is_refused():
    minimal = {
        "schema": "specdec.pivot/pivot-report/1", "status": "ok", "check_mode": False, "inventory": "i", "limit": None,
        "started_at": "t", "finished_at": "t", "wall_time_s": 1.0,
        "versions": {"ansible": "2.19", "collection": "0.1.0", "plugin": "0.1.0", "sglang": ["0.5.23"]},
        "phases": {p: {"started_at": None, "finished_at": None}
                   for p in ("preflight", "training_halt", "plugin", "switch", "report")},
        "summary": {"downtime_s": {}, "start_to_healthy_s": {}, "rolled_back": [], "gate_failed": [],
                    "disagreeing_prompts": 0},
        "training": [], "inference": [], "failures": [],
    }
    jsonschema.validate(minimal, SCHEMA)
    with pytest.raises(jsonschema.ValidationError, match="'summary' is a required property"):
        jsonschema.validate({k: v for k, v in minimal.items() if k != "summary"}, SCHEMA)
    with pytest.raises(jsonschema.ValidationError, match="'rolled back' is not one of"):
        jsonschema.validate({**minimal, "status": "rolled back"}, SCHEMA)
