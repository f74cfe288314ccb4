"""lantern.timing (speed-up statistics, interleaved rounds) and lantern.distortion (real (p, q) pairs,
exact per-step distortion, its drivers and bootstrap intervals over images), against hand-computed
values and the real decoder."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from ambiguity.errors import UsageError
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig
from ambiguity.stats import bootstrap_mean_ci
from lantern.distortion import TREE_ROW, distortion_table, image_groups, real_pairs, sibling_output_distribution
from lantern.drafter.model import load_drafter
from lantern.engine.decode import DecodeConfig, decode, neighbour_table
from lantern.rules.acceptance import AcceptanceRule
from lantern.rules.divergences import tvd
from lantern.rules.output import output_distribution
from lantern.timing import interleaved_timing, speedup_curve, speedup_table


def _timing(rows):
    cols = ["round", "config", "seconds", "tokens", "target_forwards", "target_s"]
    df = pd.DataFrame(rows, columns=cols)
    return df.assign(first=df["round"], images=1, drafter_s=0.0, acceptance_s=0.0, proximity_s=0.0)


def test_speedup_table_and_curve_by_hand():
    # AR takes 2, 2, 4 s; the method 1, 2, 0.5 s -> per-round ratios 2, 1, 8; totals 8 / 3.5
    t = _timing(
        [
            (0, "ar", 2.0, 64, 64, 1.28),
            (0, "m", 1.0, 64, 16, 0.5),
            (1, "ar", 2.0, 64, 64, 1.28),
            (1, "m", 2.0, 64, 32, 0.5),
            (2, "ar", 4.0, 64, 64, 1.28),
            (2, "m", 0.5, 64, 16, 0.5),
        ]
    )
    s = speedup_table(t).set_index("config")
    assert s.loc["m", "speedup"] == pytest.approx(8.0 / 3.5)  # the paper's ratio of total (mean) latencies
    assert s.loc["m", "speedup_median"] == pytest.approx(2.0)  # median of 2, 1, 8
    assert s.loc["m", "speedup_q25"] == pytest.approx(1.5)
    assert s.loc["m", "speedup_q75"] == pytest.approx(5.0)
    assert s.loc["m", "tokens_per_forward"] == pytest.approx(192 / 64)
    assert s.loc["m", "baseline_ms_per_forward"] == pytest.approx(1e3 * 3 * 1.28 / 192)
    assert s.loc["ar", "speedup"] == 1.0 and s.loc["m", "rounds"] == 3
    assert not s.loc["m", "speedup_exceeds_tokens_per_forward"]  # 2.29 < 3 tokens per forward
    # a round the baseline did not run does not enter the ratio of totals
    s = speedup_table(pd.concat([t, _timing([(3, "m", 9.0, 64, 16, 0.5)])])).set_index("config")
    assert s.loc["m", "speedup"] == pytest.approx(8.0 / 3.5) and s.loc["m", "rounds"] == 3
    c = speedup_curve(t, "m", ns=[1, 2, 3], n_boot=200)
    assert c["speedup"].tolist() == pytest.approx([2.0, 4.0 / 3.0, 8.0 / 3.5])
    assert (c["ci_low"] <= c["speedup"] + 1e-12).all() and (c["speedup"] <= c["ci_high"] + 1e-12).all()
    assert c.loc[0, "ci_low"] == c.loc[0, "ci_high"] == pytest.approx(2.0)  # one round: no spread


@pytest.fixture(scope="module")
def embedded():
    model = load_model("embedded", device="cpu")
    return model, load_drafter(model)


def test_interleaved_timing_decodes_the_samples_of_plain_decoding(embedded):
    model, drafter = embedded
    sampling = SamplingConfig(guidance=3.0)
    configs = {
        "ar": DecodeConfig.of("ar"),
        "sd": DecodeConfig.of("sd", gamma=3),
        "lantern": DecodeConfig.of("lantern", gamma=3, k=16, delta=0.2),
    }
    conditions = [3, 7, 1]
    seen = {}
    rows = interleaved_timing(
        model,
        configs,
        sampling,
        conditions,
        [(0, 1), (1, 1), (2, 1)],
        drafter,
        rounds_of={"lantern": 2},
        only=[0, 2],
        seed=5,
        on_round=lambda r, frame, decodes: seen.update({(r, n): d for n, d in decodes.items()}),
    )
    assert sorted(rows["round"].unique()) == [0, 2]  # only the asked rounds
    assert set(rows[rows["round"] == 0]["config"]) == {"ar", "sd", "lantern"}
    assert set(rows[rows["round"] == 2]["config"]) == {"ar", "sd"}  # lantern takes part in rounds 0, 1 only
    assert (rows["seconds"] > 0).all() and (rows["tokens"] == 64).all()
    # what a timed round decodes is exactly what an untimed decode of that image gives
    for (r, name), d in seen.items():
        plain = decode(
            model, [conditions[r]], configs[name], sampling, drafter if name != "ar" else None, seed=5, first_index=r
        )
        assert torch.equal(d.tokens, plain.tokens), (r, name)
    # a resumed measurement keeps the rounds already timed
    more = interleaved_timing(
        model,
        configs,
        sampling,
        conditions,
        [(0, 1), (1, 1), (2, 1)],
        drafter,
        rounds_of={"lantern": 2},
        seed=5,
        done=rows,
        warmup=False,
    )
    assert sorted(more["round"].unique()) == [0, 1, 2] and len(more) == len(rows) + 3


def test_real_pairs_are_the_decoders_first_draft_distributions(embedded):
    """p and q from teacher forcing equal what speculative decoding recorded at the first draft of
    every step (same guidance, temperature and top-k processing)."""
    model, drafter = embedded
    sampling = SamplingConfig(guidance=3.0, top_k=200)
    d = decode(model, [4], DecodeConfig.of("sd", gamma=4), sampling, drafter, seed=1)
    _, drafts, _ = d.frames()
    first = drafts[drafts["draft_index"] == 0]
    p, q = real_pairs(model, drafter, d.tokens, [4], sampling)
    assert p.shape == q.shape == (63, model.vocab_size)
    at = first["position"].to_numpy() - 1  # pair i predicts position i + 1
    tok = torch.tensor(first["token"].to_numpy())
    np.testing.assert_allclose(p[at, tok].numpy(), first["p_draft"].to_numpy(), atol=2e-5)
    np.testing.assert_allclose(q[at, tok].numpy(), first["q_draft"].to_numpy(), atol=2e-5)
    np.testing.assert_allclose(p[at].max(-1).values.numpy(), first["p_top1"].to_numpy(), atol=2e-5)
    assert torch.allclose(p.sum(-1), torch.ones(63), atol=1e-5) and ((p > 0).sum(-1) <= 200).all()


def test_distortion_is_zero_at_delta_zero_and_grows_with_delta(embedded):
    model, drafter = embedded
    sampling = SamplingConfig(guidance=3.0)
    d = decode(model, [2, 5], DecodeConfig.of("ar"), sampling, seed=0)
    p, q, groups = real_pairs(model, drafter, d.tokens, [2, 5], sampling, with_groups=True)
    assert groups.dtype == torch.int64 and groups.tolist() == [0] * 63 + [1] * 63  # image by image
    table = neighbour_table(model, DecodeConfig.of("lantern", k=32))
    df = distortion_table(p, q, table, [8, 32], [0.0, 0.1, 0.4], groups=groups, tree_siblings=[4])
    assert df.iloc[0]["what"] == "TVD(q, p)" and df.iloc[0]["positions"] == 126
    cols = ["what", "k", "delta", "siblings", "mean", "median", "q90", "max", "positions", "ci_low", "ci_high"]
    assert list(df.columns) == cols
    drivers = ["H(p)", "p top-1", "H(q)", "q top-1 = p top-1"]
    assert list(df["what"]) == ["TVD(q, p)"] + ["TVD(out, p)"] * 6 + [TREE_ROW] * 6 + drivers
    assert df["siblings"].tolist() == [0] * 7 + [4] * 6 + [0] * 4
    tree = df[df["what"] == TREE_ROW].set_index(["k", "delta"])["mean"]
    assert (
        tree.loc[(32, 0.0)] == pytest.approx(0.0, abs=1e-6)
        and (tree <= 4 * tree.index.get_level_values(1) + 1e-6).all()
    )
    one = sibling_output_distribution(p, q.topk(4, dim=-1).indices, table, AcceptanceRule("lantern", k=32, delta=0.4))
    assert tree.loc[(32, 0.4)] == pytest.approx(tvd(one, p).double().mean().item(), rel=1e-6)
    assert ((df["ci_low"] <= df["mean"] + 1e-12) & (df["mean"] <= df["ci_high"] + 1e-12)).all()
    drivers = df.set_index("what")
    assert drivers.loc["p top-1", "mean"] == pytest.approx(p.max(-1).values.double().mean().item(), rel=1e-6)
    agree = (p.argmax(-1) == q.argmax(-1)).double().mean().item()
    assert drivers.loc["q top-1 = p top-1", "mean"] == pytest.approx(agree)
    out = df[df["what"] == "TVD(out, p)"].set_index(["k", "delta"])["mean"]
    assert out.loc[(8, 0.0)] == pytest.approx(0.0, abs=1e-6) and out.loc[(32, 0.0)] == pytest.approx(0.0, abs=1e-6)
    assert out.loc[(32, 0.1)] < out.loc[(32, 0.4)]
    assert (out <= df.iloc[0]["mean"] + 1e-6).all()  # never further from p than the drafter itself
    # a memory cap only changes how many positions go through at once, never the numbers
    capped = distortion_table(p, q, table, [8, 32], [0.0, 0.1, 0.4], max_bytes=1, groups=groups, tree_siblings=[4])
    pd.testing.assert_frame_equal(capped, df, check_exact=False, rtol=1e-6, atol=1e-7)


# 2 images x 2 positions over V = 3 codes; image 0 = positions 0, 1; image 1 = positions 2, 3
TINY_P = [[1.0, 0.0, 0.0], [0.5, 0.25, 0.25], [0.2, 0.8, 0.0], [0.0, 0.0, 1.0]]
TINY_Q = [[1.0, 0.0, 0.0], [0.25, 0.5, 0.25], [0.0, 1.0, 0.0], [0.6, 0.0, 0.4]]


def test_driver_rows_by_hand():
    p, q = torch.tensor(TINY_P), torch.tensor(TINY_Q)
    nb = torch.tensor([[1, 2], [0, 2], [1, 0]])
    df = distortion_table(p, q, nb, [1], [0.0], groups=image_groups(2, 2)).set_index("what")
    h2 = -(0.2 * math.log(0.2) + 0.8 * math.log(0.8))  # 0.5004 nats
    h3 = -(0.6 * math.log(0.6) + 0.4 * math.log(0.4))  # 0.6730 nats
    expected = {  # per position: one-hot 0 nats; (0.5, 0.25, 0.25) 1.5 ln 2 = 1.0397 nats
        "TVD(q, p)": [0.0, 0.25, 0.2, 0.6],
        "H(p)": [0.0, 1.5 * math.log(2), h2, 0.0],
        "p top-1": [1.0, 0.5, 0.8, 1.0],
        "H(q)": [0.0, 1.5 * math.log(2), 0.0, h3],
        "q top-1 = p top-1": [1.0, 0.0, 1.0, 0.0],  # argmax q: 0, 1, 1, 0; argmax p: 0, 0, 1, 2
    }
    for what, v in expected.items():
        row = df.loc[what]
        assert (row["k"], row["delta"], row["positions"]) == (0, 0.0, 4), what
        assert row["mean"] == pytest.approx(sum(v) / 4, abs=1e-7), what
        assert row["median"] == pytest.approx(float(np.median(v)), abs=1e-7), what
        assert row["max"] == pytest.approx(max(v), abs=1e-7), what
        assert row["ci_low"] <= row["mean"] <= row["ci_high"], what
    assert df.loc["TVD(q, p)", "mean"] == pytest.approx(0.2625)
    assert df.loc["TVD(q, p)", "q90"] == pytest.approx(0.25 + 0.7 * 0.35)  # sorted 0, 0.2, 0.25, 0.6 at 2.7
    assert df.loc["p top-1", "mean"] == pytest.approx(0.825)
    assert df.loc["H(p)", "mean"] == pytest.approx(0.3850, abs=1e-4)  # (1.0397 + 0.5004) / 4
    assert df.loc["TVD(out, p)", "mean"] == pytest.approx(0.0, abs=1e-7)  # δ = 0: the step emits p
    # two images, TVD(q, p) per image 0.125 and 0.4: a resample draws {0, 0}, {0, 1} or {1, 1} (1/4, 1/2, 1/4)
    assert (df.loc["TVD(q, p)", "ci_low"], df.loc["TVD(q, p)", "ci_high"]) == pytest.approx((0.125, 0.4))
    with pytest.raises(ValueError, match="one image per pair"):
        distortion_table(p, q, nb, [1], [0.0], groups=image_groups(1, 2))


def test_bootstrap_resamples_images_when_given_groups():
    groups = image_groups(4, 8)
    assert groups.tolist() == [0] * 8 + [1] * 8 + [2] * 8 + [3] * 8
    # every position of an image alike, images 0 or 1: one image's positions are one observation
    v = np.repeat([0.0, 0.0, 1.0, 1.0], 8)
    by_image = bootstrap_mean_ci(v, groups)
    by_position = bootstrap_mean_ci(v)
    assert by_image == (0.0, 1.0)  # 4 images: all-0 and all-1 resamples each have probability 1/16 > 2.5 %
    assert 0.25 < by_position[0] < 0.5 < by_position[1] < 0.75  # 32 independent draws: about 0.5 ± 0.17
    # every image the same mean (0.1 and 0.5 within each): [mean, mean] over images, not over positions
    w = np.tile([0.1, 0.5], 4)
    lo, hi = bootstrap_mean_ci(w, image_groups(4, 2))
    assert lo == pytest.approx(0.3) and hi == pytest.approx(0.3)
    lo, hi = bootstrap_mean_ci(w)
    assert lo < 0.3 < hi
    # unequal images: a resample's mean is its drawn positions' mean (an image drawn twice counts twice)
    assert bootstrap_mean_ci([1.0, 0.0, 0.0], [0, 1, 1], n_boot=1) in {(1.0, 1.0), (0.0, 0.0), (1 / 3, 1 / 3)}
    # reproducible with the seed; another seed draws other resamples; blocks of resamples change nothing
    x = np.random.default_rng(1).random(40)
    g = image_groups(10, 4)
    assert bootstrap_mean_ci(x, g, seed=3) == bootstrap_mean_ci(x, g, seed=3)
    assert bootstrap_mean_ci(x, g, seed=3) != bootstrap_mean_ci(x, g, seed=4)
    lo, hi = bootstrap_mean_ci(x, g)
    assert lo < x.mean() < hi
    with pytest.raises(ValueError, match="one group per position"):
        bootstrap_mean_ci(x, g[:-1])


def test_positions_per_chunk_follow_the_memory_cap():
    from lantern.distortion import _positions_per_chunk

    assert _positions_per_chunk(1024, 1024, 62, "exact", 256, 1 << 30) == 256  # the embedded model: not capped
    assert _positions_per_chunk(16384, 16384, 1000, "exact", 256, 1 << 30) == 2  # every code drawable: 384 MiB each
    assert _positions_per_chunk(16384, 2000, 1000, "exact", 256, 1 << 30) == 22  # top-k 2000: 46 MiB each
    assert _positions_per_chunk(16384, 2000, 1000, "official", 256, 1 << 30) == 1
    assert _positions_per_chunk(16384, 16384, 1000, "exact", 256, 1) == 1


def test_bench_decoding_replot_recomputes_the_ratio_of_totals(tmp_path):
    """benchmarks/bench_decoding.py --replot: speed columns from the timing rounds (ratio of totals),
    the tuned SD control = the fastest SD row, the figure written."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_decoding.py"
    spec = importlib.util.spec_from_file_location("bench_decoding", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    t = _timing(
        [
            (0, "ar", 2.0, 64, 64, 1.28),
            (0, "sd-chain1", 1.0, 64, 32, 0.5),
            (0, "sd-chain2", 4.0, 64, 16, 0.5),
            (0, "lantern-chain-k8-d0.1", 1.0, 64, 16, 0.5),
            (1, "ar", 4.0, 64, 64, 1.28),
            (1, "sd-chain1", 4.0, 64, 32, 0.5),
            (1, "sd-chain2", 1.5, 64, 16, 0.5),
            (1, "lantern-chain-k8-d0.1", 1.0, 64, 16, 0.5),
        ]
    ).assign(temperature=1.0)
    stats = pd.DataFrame(
        {
            "temperature": 1.0,
            "config": ["ar", "sd-chain1", "sd-chain2", "lantern-chain-k8-d0.1"],
            "method": ["ar", "sd", "sd", "lantern"],
            "shape_kind": ["ar", "chain", "chain", "chain"],
            "setting": ["ar", "sd-chain1", "sd-chain2", "k8-d0.1"],
            "tau": [1.0, 2.0, 2.5, 3.0],
            "nll": [2.0, 2.0, 2.0, 2.5],
            "tokens_per_forward": [1.0, 2.0, 4.0, 4.0],
            "speedup": 9.0,
        }
    )  # a stale speed column is replaced
    stats.to_parquet(tmp_path / "decoding.parquet")
    t.to_parquet(tmp_path / "decoding_timing.parquet")
    files = bench.replot(tmp_path / "decoding.parquet", tmp_path / "sweep")
    assert [f.name for f in files] == ["sweep.png", "sweep.pdf"]
    df = pd.read_parquet(tmp_path / "decoding.parquet").set_index("config")
    assert df.loc["sd-chain1", "speedup"] == pytest.approx(6.0 / 5.0)  # totals: AR 6 s, chain1 5 s
    assert df.loc["sd-chain2", "speedup"] == pytest.approx(6.0 / 5.5)  # ... chain2 5.5 s (ratios 0.5 and 8/3)
    assert df.loc["sd-chain2", "speedup_median"] == pytest.approx((0.5 + 8 / 3) / 2)
    assert df.loc["lantern-chain-k8-d0.1", "speedup"] == pytest.approx(3.0)
    assert df.loc["sd-best", "setting"] == "sd-chain1"  # the fastest SD row by the ratio of totals
    assert not df.loc["lantern-chain-k8-d0.1", "speedup_exceeds_tokens_per_forward"]  # 3 < 4 tokens per forward


def test_sibling_output_distribution_by_hand():
    """p = (0.4, 0.3, 0.2, 0.1), children 1 then 2 (point masses), k = 1, B_1(1) = B_1(2) = {3}, δ = 0.25.
    Child 1: S_1 = p(3) = 0.1 <= δ, p̃ = 0.4: emitted with 0.4; rejected -> r_1 = (4, 0, 2, 1)/7.
    Child 2 (reach 0.6): S_1 = r_1(3) = 1/7 <= δ, p̃ = 3/7: emitted with 0.6 * 3/7 = 9/35; rejected
    (reach 0.6 * 4/7 = 12/35) -> r_2 = (0.8, 0, 0, 0.2). out = (9.6, 14, 9, 2.4)/35, TVD(out, p) = 11/70.
    At δ = 0: out = p exactly (1 w.p. 0.3; 2 w.p. 0.7 * 2/7; the rest (0.4, 0.1))."""
    p = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    nb = torch.tensor([[1, 2, 3], [3, 0, 2], [3, 1, 0], [2, 1, 0]])
    out = sibling_output_distribution(p, torch.tensor([1, 2]), nb, AcceptanceRule("lantern", k=1, delta=0.25))
    assert out.tolist() == pytest.approx([9.6 / 35, 14 / 35, 9 / 35, 2.4 / 35], abs=1e-15)
    assert float(tvd(out, p)) == pytest.approx(11 / 70, abs=1e-15)
    exact = sibling_output_distribution(p, torch.tensor([1, 2]), nb, AcceptanceRule("lantern", k=1, delta=0.0))
    assert exact.tolist() == pytest.approx(p.tolist(), abs=1e-15)
    # the official convention zeroes B_2(1) = {3, 0} after rejecting 1: r_1 = e_2, so child 2 is always accepted
    official = AcceptanceRule("lantern", k=1, delta=0.25, convention="official")
    assert sibling_output_distribution(p, torch.tensor([1, 2]), nb, official).tolist() == pytest.approx(
        [0, 0.4, 0.6, 0]
    )
    with pytest.raises(UsageError, match="siblings has shape"):
        sibling_output_distribution(p, torch.tensor([[1, 2]]), nb, AcceptanceRule("lantern", k=1, delta=0.25))


def test_deterministic_siblings_move_at_most_m_delta_where_sampled_drafts_move_far_more():
    """Seeded random (p, q) pairs over V = 64 with a flat drafter far from p: the exact convention's
    deterministic tree node stays within m δ of p (a coupling with the lossless walk differs only
    where a relaxed acceptance fired, probability <= δ per child), while one step with drafts
    sampled from the same q moves several times further (its bound is Σ_y min(max(q - p, 0), δ))."""
    g = torch.Generator().manual_seed(0)
    V, m, delta = 64, 4, 0.05
    p = torch.softmax(3 * torch.randn(32, V, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(32, V, generator=g, dtype=torch.float64), -1)
    nb = torch.stack([torch.randperm(V, generator=g) for _ in range(V)])
    nb = torch.stack([row[row != v] for v, row in enumerate(nb)])
    rule = AcceptanceRule("lantern", k=16, delta=delta)
    tree = tvd(sibling_output_distribution(p, q.topk(m, dim=-1).indices, nb, rule), p)
    chain = tvd(output_distribution(p, q, nb, rule), p)
    assert (tree <= m * delta + 1e-12).all() and tree.max() > 0.5 * delta
    assert chain.mean() > 2 * tree.mean() and (chain > m * delta).any()


def test_probe_emitted_tokens_stats_by_hand():
    """benchmarks/probe_emitted_tokens.py's per-position numbers, p = (0.8, 0.2, 0), H(p) = 0.5004 nats:
    out = e_1 -> TVD 0.8, excess -ln 0.2 - H = +1.1090 nats (mass on the unlikely token);
    out = e_0 -> TVD 0.2, excess -ln 0.8 - H = -0.2773 (on the likely one);
    out = (0.5, 0, 0.5) -> half the mass where p = 0: out of support 0.5, excess over the rest -0.2773."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "probe_emitted_tokens.py"
    spec = importlib.util.spec_from_file_location("probe_emitted_tokens", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    p = torch.tensor([[0.8, 0.2, 0.0]] * 3, dtype=torch.float64)
    out = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.0, 0.5]], dtype=torch.float64)
    got = mod.emitted_stats(out, p)
    h = -(0.8 * math.log(0.8) + 0.2 * math.log(0.2))
    assert got["tvd"].tolist() == pytest.approx([0.8, 0.2, 0.5])
    assert got["out_of_support"].tolist() == pytest.approx([0.0, 0.0, 0.5])
    assert got["excess_nll"].tolist() == pytest.approx([-math.log(0.2) - h, -math.log(0.8) - h, -math.log(0.8) - h])
    assert mod.emitted_stats(p, p)["excess_nll"].tolist() == pytest.approx([0.0] * 3, abs=1e-12)


def test_neighbour_tables_builds_relaxed_configs_only_and_passes_progress(monkeypatch):
    """lantern.timing.neighbour_tables: one table per relaxed configuration (none for AR or lossless SD),
    the builder's progress flag passed through (lantern.paper --no-progress gives False)."""
    import lantern.timing

    seen = []

    def spy(model, config, **kwargs):
        seen.append((config.method, kwargs.get("progress")))
        return torch.zeros(1, 1, dtype=torch.long)

    monkeypatch.setattr(lantern.timing, "neighbour_table", spy)
    configs = {"ar": DecodeConfig.of("ar"), "sd": DecodeConfig.of("sd"), "lan": DecodeConfig.of("lantern", k=4)}
    model = object()  # only handed on to the builder
    assert list(lantern.timing.neighbour_tables(model, configs, progress=False)) == ["lan"]
    assert list(lantern.timing.neighbour_tables(model, configs)) == ["lan"]
    assert seen == [("lantern", False), ("lantern", None)]
