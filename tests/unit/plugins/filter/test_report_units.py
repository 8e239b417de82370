"""Human units in the report (issue 16, point 10): durations, K/M/G rates, phase durations from timestamps."""

from __future__ import annotations

import pytest
from ansible_collections.specdec.pivot.plugins.filter import pivot as f


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.42, "0.42 s"),
        (5.333, "5.33 s"),
        (12.34, "12.3 s"),
        (59.99, "60 s"),
        (60, "1 min 0 s"),
        (62.5, "1 min 2.5 s"),
        (119.96, "2 min 0 s"),
        (600.04, "10 min 0 s"),
        (3725, "1 h 2 min 5 s"),
        ("7.5", "7.5 s"),
        (-3, "-3 s"),
        (None, "n/a"),
        ("soon", "n/a"),
    ],
)
def test_pivot_duration(seconds, text):
    assert f.pivot_duration(seconds) == text


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (19500, "tok/s", "19.5K tok/s"),
        (1234567, "tok/s", "1.23M tok/s"),
        (2.5e9, "", "2.5G"),
        (812.4, "tok/s", "812 tok/s"),
        (99.5, "tok/s", "99.5 tok/s"),
        (0.123, "", "0.123"),
        (None, "tok/s", "n/a"),
    ],
)
def test_pivot_si(value, unit, text):
    assert f.pivot_si(value, unit) == text


@pytest.mark.parametrize(
    ("start", "end", "seconds"),
    [
        ("2026-12-03T10:00:00Z", "2026-12-03T10:01:02.500000Z", 62.5),
        ("2026-12-03T10:00:00.250000Z", "2026-12-03T10:00:00.750000Z", 0.5),
        ("2026-12-03T10:00:00+00:00", "2026-12-03T11:00:00+01:00", 0.0),
        (None, "2026-12-03T10:00:00Z", None),
        ("not a time", "2026-12-03T10:00:00Z", None),
    ],
)
def test_pivot_seconds_between(start, end, seconds):
    assert f.pivot_seconds_between(start, end) == seconds
