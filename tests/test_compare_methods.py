"""benchmarks/compare_methods.py's pure helpers: the bin table (with lantern.replay.with_wilson's Wilson
intervals per ambiguity bin), the throughput table and the method colours of its figure."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest


def _module():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_methods.py"
    spec = importlib.util.spec_from_file_location("compare_methods", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_with_wilson_hand_computed_and_bin_table():
    cj = _module()
    from lantern.replay import ambiguity_bins, with_wilson

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
    b = with_wilson(ambiguity_bins(drafts, "p_top1", np.linspace(0, 1, 11))).assign(method="sjd")
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


def test_throughput_table_hand_computed():
    """Images/s per round = images / seconds; median and spread over rounds; the per-round ratio to AR."""
    cj = _module()
    timing = pd.DataFrame(
        {
            "round": [0, 0, 1, 1, 2, 2],
            "config": ["ar", "sjd", "sjd", "ar", "ar", "sjd"],
            "images": [16] * 6,
            "seconds": [8.0, 4.0, 2.0, 4.0, 16.0, 4.0],  # ar 2, 4, 1 img/s; sjd 4, 8, 4 img/s
        }
    )
    t = cj.throughput_table(timing)
    assert t.loc["ar", "images_per_s"] == 2.0 and t.loc["ar", "vs_ar"] == 1.0
    assert (t.loc["sjd", "images_per_s"], t.loc["sjd", "images_per_s_min"], t.loc["sjd", "images_per_s_max"]) == (
        4.0,
        4.0,
        8.0,
    )
    # per-round ratios 4/2, 8/4, 4/1 = 2, 2, 4
    assert (t.loc["sjd", "vs_ar"], t.loc["sjd", "vs_ar_min"], t.loc["sjd", "vs_ar_max"]) == (2.0, 2.0, 4.0)
    assert t.loc["sjd", "rounds"] == 3


def test_every_method_keeps_its_colour_in_the_figure(tmp_path, monkeypatch):
    """The speed bars, the acceptance curves and the quality markers of a method all carry
    ambiguity.plots.METHOD_COLORS[method], whatever the order or subset of methods."""
    import matplotlib.colors as mcolors

    from ambiguity.plots import METHOD_COLORS

    cj = _module()
    figs = []
    monkeypatch.setattr(cj.plots, "save_figure", lambda fig, path: figs.append(fig) or [])
    for methods in (["ar", "sd", "sjd", "gsd"], ["gsd", "ar", "lantern"]):
        n = len(methods)
        table = pd.DataFrame(
            {
                "tokens_per_forward": np.linspace(1, 2, n),
                "speedup": np.linspace(1, 1.5, n),
                "throughput_vs_ar": np.linspace(1, 1.2, n),
                "throughput_vs_ar_min": np.linspace(0.9, 1.1, n),
                "throughput_vs_ar_max": np.linspace(1.1, 1.3, n),
            },
            index=pd.Index(methods, name="method"),
        )
        bins = pd.DataFrame(
            {
                "method": [m for m in methods if m != "ar" for _ in range(2)],
                "mid": [0.25, 0.75] * (n - 1),
                "acceptance_rate": 0.5,
                "ci_low": 0.4,
                "ci_high": 0.6,
                "drafts": 50,
            }
        )
        cj.plot_comparison(table, bins, "t", tmp_path / "f", batch_size=4)
        speed, acc = figs[-1].axes[:2]
        bars = [p for p in speed.patches if np.isfinite(p.get_height())]
        assert len(bars) == 3 * n
        for k in range(3):  # three measures, each one bar per method in table order
            got = [mcolors.to_hex(p.get_facecolor(), keep_alpha=False) for p in bars[k * n : (k + 1) * n]]
            assert got == [METHOD_COLORS[m] for m in methods]
        curves = list(acc.containers)
        assert len(curves) == n - 1
        for c, m in zip(curves, [m for m in methods if m != "ar"]):
            assert mcolors.to_hex(c.lines[0].get_color()) == METHOD_COLORS[m], m


def test_configs_and_sampling_follow_the_paper_mapped_to_the_codebook():
    """k 1000 and top-k 2000 of LlamaGen's 16384 codes become 62 and 125 of embedded's 1024 (rounded
    fractions); δ 0.1, CFG 3; a text model samples without guidance or filters; every published row
    names a method the comparison knows."""
    cm = _module()
    cfgs = cm.configs(1024)
    assert cfgs["lantern"].rule.k == 62 and cfgs["lantern"].rule.delta == 0.1 and cfgs["lantern++"].rule.k == 62
    assert cfgs["eagle-2"].tree.kind == "dynamic" and cfgs["sjd"].method == "sjd"
    assert cm.configs(16384)["lantern"].rule.k == 1000
    s = cm.paper_sampling("c2i", 1024, None)
    assert (s.guidance, s.temperature, s.top_k) == (3.0, 1.0, 125)
    assert cm.paper_sampling("text", 1024, None).top_k == 0
    published = cm.published_table()
    assert set(published["method"]) <= set(cm.NAMES)
    assert published.set_index("method").loc["lantern", "speedup"] == "1.69"


def test_a_stopped_run_resumes_from_the_methods_it_finished(tmp_path, monkeypatch):
    """Each method's decode results are saved when it is done; a rerun with the same options reads
    them (no decode) and writes the same statistics; other options decode again."""
    cm = _module()
    argv = ["--model", "embedded", "--num-images", "4", "--timing-images", "1", "--batch-size", "1"]
    argv += ["--no-quality", "--target-images", "2", "--distortion-images", "1", "--only", "lantern"]
    argv += ["--out", str(tmp_path), "--figure", str(tmp_path / "fig")]
    assert cm.main(argv) == 0
    first = pd.read_csv(tmp_path / "compare_methods_embedded.csv", index_col="method")
    assert sorted(p.name for p in tmp_path.glob("compare_methods_embedded.parts/*/*.json")) == [
        "ar.json",
        "lantern.json",
    ]

    def no_decode(*args, **kwargs):
        raise AssertionError("a finished method was decoded again")

    monkeypatch.setattr(cm, "decode_stats", no_decode)
    assert cm.main(argv) == 0
    again = pd.read_csv(tmp_path / "compare_methods_embedded.csv", index_col="method")
    cols = ["tokens_per_forward", "tau", "acceptance_rate", "target_nll", "distortion_tvd"]
    pd.testing.assert_frame_equal(again[cols], first[cols])
    assert first.loc["lantern", "distortion_tvd"] > 0 and first.loc["ar", "distortion_tvd"] == 0
    with pytest.raises(AssertionError, match="decoded again"):  # another seed: other decodes
        cm.main(argv + ["--seed", "1"])
