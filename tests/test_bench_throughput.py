"""benchmarks/bench_throughput.py: a model without a VQ codebook (text-twin) times AR (no LANTERN
neighbour table, no drafter), on the device --device names."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd


def _module():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_throughput.py"
    spec = importlib.util.spec_from_file_location("bench_throughput", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_text_twin_ar_needs_no_codebook(tmp_path, monkeypatch):
    bt = _module()
    monkeypatch.setattr(bt, "load_drafter", lambda *a, **k: (_ for _ in ()).throw(AssertionError("drafter loaded")))
    argv = ["--models", "text-twin", "--methods", "ar", "--batch-sizes", "1", "--images", "1", "--repeats", "1"]
    assert bt.main([*argv, "--device", "cpu", "--threads", "1", "--out", str(tmp_path)]) == 0
    rows = pd.read_parquet(tmp_path / "throughput.parquet")
    cells = rows[["model", "method", "batch_size", "images"]].values.tolist()
    assert cells == [["text-twin", "ar", 1, 2]]  # images: max(--images, 2 B)
    assert rows["tau"].tolist() == [1.0]  # AR: one token per step
    summary = json.loads((tmp_path / "throughput.json").read_text())
    assert summary["device"] == "cpu" and summary["dtype"] == "float32"
