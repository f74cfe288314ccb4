"""benchmarks/compare_jacobi.py's pure helpers: Wilson intervals per ambiguity bin and the bin table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest


def _module():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_jacobi.py"
    spec = importlib.util.spec_from_file_location("compare_jacobi", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_with_wilson_hand_computed_and_bin_table():
    cj = _module()
    from lantern.replay import ambiguity_bins

    # 100 reached drafts at top-1 0.55 (50 committed), 4 at 0.95 (all committed), 1 unreached at 0.05
    drafts = pd.DataFrame(
        {
            "p_top1": [0.55] * 100 + [0.95] * 4 + [0.05],
            "reached": [True] * 104 + [False],
            "committed": [1] * 50 + [0] * 50 + [1] * 4 + [0],
            "j_star": 0,
            "p_tilde": 0.0,
            "p_draft": 0.0,
        }
    )
    b = cj.with_wilson(ambiguity_bins(drafts, "p_top1", np.linspace(0, 1, 11))).assign(method="sjd")
    # Wilson 95 %, p̂ = 0.5, n = 100: centre 0.5, half = z / (1 + z²/n) · sqrt(p̂(1-p̂)/n + z²/(4n²))
    z = 1.959963984540054
    half = z / (1 + z * z / 100) * np.sqrt(0.25 / 100 + z * z / 40000)
    mid = b[b["lo"] == 0.5].iloc[0]
    assert mid["drafts"] == 100 and mid["acceptance_rate"] == 0.5
    assert mid["ci_low"] == pytest.approx(0.5 - half, abs=1e-12) and mid["ci_high"] == pytest.approx(
        0.5 + half, abs=1e-12
    )
    assert round(0.5 - half, 4) == 0.4038
    top = b[b["lo"] == 0.9].iloc[0]  # 4 of 4: [z²/(n + z²), 1]
    assert top["ci_high"] == 1.0 and top["ci_low"] == pytest.approx(4 / (4 + z * z), abs=1e-12)
    empty = b[b["lo"] == 0.0].iloc[0]  # the unreached draft is not counted
    assert empty["drafts"] == 0 and np.isnan(empty["ci_low"]) and np.isnan(empty["ci_high"])
    t = cj.bins_table(b)
    assert list(t.columns) == ["sjd"] and t.loc["0.5-0.6", "sjd"] == "0.50 [0.40, 0.60] (100)"
    assert t.loc["0.0-0.1", "sjd"] == "—" and t.loc["0.9-1.0", "sjd"] == "1.00 [0.51, 1.00] (4)"
