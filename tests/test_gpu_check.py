"""benchmarks/gpu_check.py --smoke on the CPU: every part reports or says why it was skipped, and the
verify-cost part's bounds are τ over the measured costs (the drafter's steps only lower them)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest


def _module():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_reports_every_part_and_the_verify_cost(tmp_path):
    gc = _module()
    out = tmp_path / "gpu_check.json"
    assert gc.main(["--smoke", "--device", "cpu", "--latency-images", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["cuda_tests"] == {"skipped": "--smoke"} and report["faiss_gpu_knn"] == {"skipped": "--smoke"}
    assert set(report["latency"]) == {"ar", "lantern-chain", "lantern-dynamic"}
    assert set(report["throughput"]) == {"ar@1", "ar@4", "lantern-chain@1", "lantern-chain@4"}
    assert set(report["verify_cost"]) == {"1", "4"}  # the smoke batch sizes
    for row in report["verify_cost"].values():
        t1, t5, t16 = row["ms_1_tokens"], row["ms_5_tokens"], row["ms_16_tokens"]
        assert row["cost_5"] == pytest.approx(t5 / t1) and row["cost_16"] == pytest.approx(t16 / t1)
        assert row["bound_lantern"] == pytest.approx(gc.TAU["lantern_chain_4"] * t1 / t5)
        assert row["bound_sjd"] == pytest.approx(gc.TAU["sjd_window_16"] * t1 / t16)
        assert 0 < row["bound_lantern_with_drafter"] < row["bound_lantern"]
