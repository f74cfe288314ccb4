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


def test_methods_map_to_their_configs():
    """``-auto`` rows are the chains with gamma="auto" (up to --gamma-max), ``ar-compiled`` is AR,
    LANTERN takes --k and --delta; --quick sets the smoke run."""
    bt = _module()
    args = bt.build_parser().parse_args(["--gamma", "3", "--gamma-max", "6", "--quick"])
    auto = bt.config_of("lantern-auto", args, 62)
    assert auto.auto and auto.gamma_max == 6 and auto.rule.k == 62 and auto.rule.delta == 0.1
    fixed = bt.config_of("sd", args, 62)
    assert fixed.gamma == 3 and not fixed.auto and fixed.rule.method == "sd"
    assert bt.config_of("sd-auto", args, 62).auto and bt.config_of("ar-compiled", args, 62).method == "ar"
    assert bt.config_of("lantern-dynamic", args, 62).tree.kind == "dynamic"
    assert set(bt.QUICK) <= set(vars(args)) and args.quick
