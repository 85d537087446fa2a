"""The recorded fixed-seed runs (see `runs.py`) give the same losses, validation losses and outputs today."""

from __future__ import annotations

import json

import pytest

from tests.golden.runs import CASES, GOLDEN_FILE, run_case

RELATIVE = 1e-5

# The runs were recorded with torch's default CPU threads (`python -m tests.golden.runs`); the rest of the suite
# computes with fewer (tests/conftest.py), and a sample's mean pixel moves by ~1e-3 with the thread count.
pytestmark = pytest.mark.usefixtures("torch_default_threads")


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= RELATIVE * max(abs(a), abs(b), 1e-8)


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_matches_the_recorded_one(tmp_path, name):
    expected = json.loads(GOLDEN_FILE.read_text(encoding="utf-8"))[name]
    got = run_case(name, tmp_path)
    assert len(got["losses"]) == len(expected["losses"])
    for step, (a, b) in enumerate(zip(got["losses"], expected["losses"]), start=1):
        assert _close(a, b), f"step {step}: loss {a} != recorded {b}"
    assert got["validation"].keys() == expected["validation"].keys()
    for tag, value in expected["validation"].items():
        assert _close(got["validation"][tag], value), f"{tag}: {got['validation'][tag]} != recorded {value}"
    assert len(got["samples"]) == len(expected["samples"])
    for a, b in zip(got["samples"], expected["samples"]):
        assert abs(a - b) <= 1e-3, f"sample mean pixel {a} != recorded {b}"
    assert got["output"]["numel"] == expected["output"]["numel"]
    for key in ("sum", "abs_sum"):
        assert _close(got["output"][key], expected["output"][key]), f"output {key}"
