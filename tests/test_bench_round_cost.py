"""benchmarks/bench_round_cost.py: every token but the first is committed in a round (AR one a
round, LANTERN τ a round), the sections do not overlap, the ratios are against AR of the same repeat;
an unknown method is one line, exit 2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

from ambiguity.models.registry import load_model


def _module():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_round_cost.py"
    spec = importlib.util.spec_from_file_location("bench_round_cost", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rounds_commit_every_token_and_sections_add_up(tmp_path):
    rc = _module()
    out = tmp_path / "round_cost.csv"
    argv = ["--models", "embedded", "--methods", "lantern", "--batch-sizes", "1,2", "--images", "2"]
    assert rc.main([*argv, "--repeats", "1", "--threads", "1", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert table[["batch_size", "method"]].values.tolist() == [[1, "ar"], [1, "lantern"], [2, "ar"], [2, "lantern"]]
    N = load_model("embedded").num_tokens  # the first token comes with admission, the rest in rounds
    np.testing.assert_allclose(table["tau"] * table["rounds_per_image"], N - 1, rtol=1e-4)
    ar, lantern = table[table.method == "ar"], table[table.method == "lantern"]
    assert (ar["tau"] == 1).all() and (ar["rounds_per_image"] == N - 1).all()
    assert (ar[["speedup", "verify_cost"]] == 1).all().all() and (ar["ms_drafter"] == 0).all()
    assert (lantern["tau"] > 1.5).all() and (lantern["ms_drafter"] > 0).all()
    assert (table["ms_other"] >= 0).all()  # the timed sections never count a second twice
    rows = pd.read_parquet(out.with_suffix(".parquet"))
    assert len(rows) == 4 and set(rows["images"]) == {2, 4}  # max(--images, 2 B)


def test_unknown_method_is_one_line(capsys):
    rc = _module()
    assert rc.main(["--methods", "lantern,ar-compiled", "--out", "/nonexistent/x.csv"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ar-compiled" in err[0] and "choose from" in err[0]
