"""PJD, parallel Jacobi decoding (lantern.methods.spatial.method, --method pjd), on tiny random models.

* exact enumeration of the real decoder (every random initial draft, coin, residual and draft
  draw branched): with ``offset = W`` rows run one after another, each an SJD window, and the
  joint is AR's exactly (1e-12); with an earlier row start the first row stays AR's law exactly
  and the joint moves (TVD pinned);
* greedy PJD with ``offset = W`` equals greedy AR token for token (an earlier start: its first row);
* in float64 batch 1 equals batch 3 (tokens and every non-timing record);
* records (window drafts, proposed_step, row-causal layout) and the CLI.
"""

import pytest
import torch
from test_trees import exact_joint, tiny
from test_zipar import BATCH_SAMPLINGS, grid3, marginal, spatial_joint, tvd_of

from ambiguity.sampling import SamplingConfig
from lantern.engine.decode import DecodeConfig, decode

SAMPLING = SamplingConfig(guidance=1.5, temperature=1.0, top_k=2)


@pytest.mark.slow  # ~30 s on 2 shared cores: a few thousand enumerated runs
def test_row_by_row_pjd_is_exactly_ar_sampling():
    """2 x 2 tokens, V = 4, offset = W = 2, windows of 2 tokens (one draft): SJD within each row."""
    m = tiny(std=1.5)
    want = exact_joint(m, 1, SAMPLING)
    got, runs, stats = spatial_joint(m, "pjd", SAMPLING, rows=2, offset=2)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12) and runs > 20
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), seq
    assert stats["drafts"] > 0 and stats["rejected"] > 0


@pytest.mark.slow  # ~30 s
def test_early_row_start_moves_the_joint():
    """Offset 1 on 2 x 2 tokens: row 1 starts when row 0 has one token, from the stand-in input
    (row 0's newest token at the position of (0, 1)), without seeing x_(0,1): row 0 keeps AR's law
    exactly, the joint does not (TVD pinned)."""
    m = tiny(std=1.5)
    want = exact_joint(m, 1, SAMPLING)
    got, _, stats = spatial_joint(m, "pjd", SAMPLING, rows=2, offset=1)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    row0, ar0 = marginal(got, 2), marginal(want, 2)
    assert max(abs(row0.get(k, 0.0) - v) for k, v in ar0.items()) < 1e-12
    assert tvd_of(got, want) == pytest.approx(0.026102340399977827, rel=1e-9)
    assert stats["drafts"] > 0 and stats["rejected"] > 0


def test_greedy_row_by_row_pjd_equals_greedy_ar():
    """offset = W: greedy AR's tokens at any window and batch; an earlier start keeps greedy AR's first row."""
    m = grid3(vocab=16)
    g = SamplingConfig(guidance=2.0, temperature=0.0)
    labels = list(range(6))
    ar = decode(m, labels, DecodeConfig.of("ar"), g)
    for rows in (1, 2, 3):
        for B in (1, 4):
            out = decode(m, labels, DecodeConfig.of("pjd", rows=rows, offset=3), g, batch_size=B)
            assert torch.equal(out.tokens, ar.tokens), (rows, B)
    early = decode(m, labels, DecodeConfig.of("pjd", rows=2, offset=1), g)
    assert torch.equal(early.tokens[:, :3], ar.tokens[:, :3])  # the first row sees what AR's does


@pytest.mark.parametrize("knobs", [dict(rows=2, offset=1), dict(rows=3, offset=2), dict(rows=3, offset=3)])
def test_float64_batch_three_equals_batch_one(knobs):
    from test_engine import _same_records

    m = grid3(vocab=16)
    labels = [0, 3, 5, 7, 1, 9, 4]
    cfg = DecodeConfig.of("pjd", **knobs)
    for s in BATCH_SAMPLINGS:
        one = decode(m, labels, cfg, s, seed=11, first_index=5)
        many = decode(m, labels, cfg, s, seed=11, first_index=5, batch_size=3)
        assert torch.equal(one.tokens, many.tokens), s
        _same_records(one, many)


def test_records():
    """Window drafts: at most L - 1 per active row, proposed by the previous step or initialised
    (-1, a point mass q = 1); committed drafts = accepted drafts; the rows' tokens add up to N."""
    m = grid3(vocab=16)
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    out = decode(m, list(range(4)), DecodeConfig.of("pjd", rows=3, offset=1), s, seed=2)
    steps, drafts, images = out.frames()
    assert out.method == "pjd" and out.gamma == 2 and out.settings["pjd_window"] == 3
    assert (images["target_forwards"] == 1 + images["steps"]).all()
    assert (steps.groupby("image")["emitted"].sum() + 1 == 9).all()
    init = drafts[drafts["proposed_step"] == -1]
    assert len(init) and (init["q_draft"] == 1.0).all()
    kept = drafts[drafts["proposed_step"] >= 0]
    assert len(kept) and (kept["proposed_step"] == kept["step"] - 1).all()
    assert (drafts["sibling"] == drafts["position"] // 3).all()
    per_row = drafts.groupby(["image", "step", "sibling"]).size()
    assert per_row.max() <= 2 and (steps.set_index(["image", "step"])["drafted"] > 0).any()
    unreached = drafts[~drafts["reached"]]
    assert len(unreached) and unreached["accept_prob"].isna().all() and not unreached["accepted"].any()
    assert (drafts.groupby(["image", "step"]).size().values == steps[steps["drafted"] > 0]["drafted"].values).all()
    assert (steps["emitted"] > 1).any()  # rows ran in parallel or drafts were accepted
    assert drafts["committed"].sum() <= steps["accepted"].sum()


def test_generate_cli(tmp_path, capsys):
    from lantern.generate import main

    assert main(["--method", "pjd", "--pjd-window", "9", "--num-images", "1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pjd-window must be <= 8, the tokens per row of embedded" in err[0], err
    argv = ["--method", "pjd", "--pjd-window", "3", "--pjd-offset", "2", "--num-images", "2", "--batch-size", "2"]
    assert main(argv + ["--out", str(tmp_path / "ok"), "--no-progress"]) == 0
