"""The committed CPU benchmark results (``benchmarks/cpu_bench.py``) carry exactly the issue's
fields, and the detail file beside each holds the same rows with the run's settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "cpu-2core"
FIELDS = ("engine", "model", "quant", "ttfa_ms", "speed", "rss_gb")


@pytest.mark.parametrize(
    "folder", [RESULTS, RESULTS / "run2", RESULTS / "short-prompt"], ids=["benchmark-sentence", "run2", "short-prompt"]
)
def test_cpu_results_have_the_issue_fields_and_match_their_detail(folder: Path) -> None:
    rows = json.loads((folder / "results.json").read_text())["rows"]
    detail = json.loads((folder / "results-detail.json").read_text())
    assert rows and all(tuple(row) == FIELDS for row in rows)
    assert [{k: r[k] for k in FIELDS} for r in detail["rows"] if r.get("clients", 1) == 1] == rows  # several clients: detail only
    assert {(r["engine"], r["model"]) for r in rows} == {(e, m) for e in ("ggml", "reference") for m in ("0.6B", "1.7B")}
    assert detail["meta"]["cores"] >= 1 and len(detail["meta"]["loadavg_before"]) == 3
