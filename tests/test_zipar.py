"""ZipAR (lantern.methods.spatial.method, --method zipar) on tiny random 3 x 3-grid models.

* exact enumeration of the real decoder (every draw and coin branched with its probability): the
  joint law of an image against AR's exact joint (teacher forcing). Fixed window s < W: the first
  two rows are exactly AR's (row 1 starts after the whole first row and sees nothing below it),
  the last row is not, so the joint moves (TVD measured and pinned); s = W is AR exactly. The
  adaptive window (the paper's rejection sampling of a row start) likewise, with its own TVD, and
  exactly AR's joint where the check of the row start sees the whole row above (s_min = 2);
  the s = 1 joint equals the law of a hand-written schedule (each cell's input and visible cells,
  the stand-in row start included), computed with fresh forwards of the model (1e-12);
* s = W gives AR's tokens token for token (sampling and greedy), at any batch size;
* in float64 batch 1 equals batch 3 (tokens and every non-timing record) with CFG, temperature,
  top-k / top-p, greedy, images entering freed slots;
* the forward count of the fixed schedule (tokens per forward) by hand; records of adaptive row
  starts; one-line refusals (text model, window past the row, bad knobs, the CLI).
"""

from collections import defaultdict

import numpy as np
import pytest
import torch
from test_trees import enumerate_outcomes, exact_joint, tiny

from ambiguity.errors import UsageError
from ambiguity.sampling import SamplingConfig, distribution, expand_rows
from lantern.engine.decode import DecodeConfig, decode
from lantern.methods.spatial.config import SpatialConfig, check_spatial

SAMPLING = SamplingConfig(guidance=1.5, temperature=1.0, top_k=2)
BATCH_SAMPLINGS = [
    SamplingConfig(guidance=2.0, temperature=0.7, top_k=2),
    SamplingConfig(guidance=1.0, temperature=1.3, top_p=0.8),
    SamplingConfig(guidance=2.0, temperature=0.0),
]


def grid3(vocab=3, seed=0):
    """A one-layer float64 LlamaGen GPT on a 3 x 3 grid (rows start before the row above is done)."""
    return tiny(vocab=vocab, block=9, seed=seed, std=1.5)


def spatial_joint(m, method, sampling, label=1, **knobs):
    """{tokens: probability} of one image under the real decoder, every draw branched; and stats."""
    stats = defaultdict(int)

    def run(draws):
        out = decode(m, [label], DecodeConfig.of(method, **knobs), sampling, draws={0: draws})
        stats["drafts"] += len(out.drafts["token"])
        stats["rejected"] += int((~out.drafts["accepted"]).sum()) if len(out.drafts["token"]) else 0
        return tuple(out.tokens[0].tolist())

    got, runs = enumerate_outcomes(run)
    return got, runs, stats


def marginal(joint, n):
    out = defaultdict(float)
    for seq, prob in joint.items():
        out[seq[:n]] += prob
    return out


def tvd_of(a, b):
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@pytest.mark.slow  # ~50 s on 2 shared cores: 2^9 runs (and more for the adaptive window) per law
def test_exact_joint_of_fixed_and_adaptive_windows():
    """V = 3 with top-k 2 (two branches per draw), 3 x 3 tokens. The first two rows are AR's law
    exactly (1e-12); the third row starts with s tokens of row 1 and misses the rest, so the joint
    moves: TVD to AR (pinned) for s = 1, 2 and the adaptive window from s_min = 1; s = 3 = W is AR,
    and so is the adaptive window from s_min = 2 (its one check sees the whole row above)."""
    m = grid3()
    want = exact_joint(m, 1, SAMPLING)
    tvds = {}
    for name, knobs in (("s1", dict(window=1)), ("s2", dict(window=2)), ("ad1", dict(window=1, adaptive=True))):
        got, runs, stats = spatial_joint(m, "zipar", SAMPLING, **knobs)
        assert sum(got.values()) == pytest.approx(1.0, abs=1e-12) and runs >= 2**9
        rows01, ar01 = marginal(got, 6), marginal(want, 6)
        assert max(abs(rows01.get(k, 0.0) - v) for k, v in ar01.items()) < 1e-12, name
        tvds[name] = tvd_of(got, want)
        if name == "ad1":
            assert stats["drafts"] > 0 and stats["rejected"] > 0  # row starts accepted and rejected
    want_tvd = {"s1": 0.005669953291715966, "s2": 0.005875814564918228, "ad1": 0.005242432002772784}
    assert tvds == pytest.approx(want_tvd, rel=1e-9), tvds
    got, _, _ = spatial_joint(m, "zipar", SAMPLING, window=3)
    assert tvd_of(got, want) < 1e-12
    # adaptive from s_min = 2: the row start drafted with two tokens of row 1 is judged once, in the
    # forward that reads row 1's last token (the full context): speculative sampling, AR's law exactly
    got, _, stats = spatial_joint(m, "zipar", SAMPLING, window=2, adaptive=True)
    assert tvd_of(got, want) < 1e-12 and stats["rejected"] > 0


# ZipAR, s = 1 on 3 x 3 (cells 0..8 in raster order), by hand: cell -> (input token's cell, its
# position, the committed cells the input sees). Forwards: 1-2 row 0; 3: cell 3 (row 1 waits for
# row 0); 4: cells 4 and 6 (row 2 starts from the stand-in: the newest token of row 0, cell 2, at
# the position of cell 5, seeing cells 0-3); 5: cells 5 and 7 (cell 7 from cell 6, which sees
# cells 0-4 and itself: cell 5 is not committed yet); 6: cell 8 (from cell 7, everything before).
S1_SCHEDULE = {
    1: (0, 0, [0]),
    2: (1, 1, [0, 1]),
    3: (2, 2, [0, 1, 2]),
    4: (3, 3, [0, 1, 2, 3]),
    6: (2, 5, [0, 1, 2, 3]),
    5: (4, 4, [0, 1, 2, 3, 4]),
    7: (6, 6, [0, 1, 2, 3, 4, 6]),
    8: (7, 7, [0, 1, 2, 3, 4, 5, 6, 7]),
}


def scheduled_law(m, seqs, label, sampling, schedule):
    """P(seq) = p(x_0) * prod over cells of p(x_cell | the input and cells the schedule says),
    each factor from one fresh forward of the model (a one-layer model: a cached key depends only
    on its token and position, so the law is a function of what each input sees)."""
    x = torch.tensor(seqs)
    rows, N = len(seqs), m.num_tokens
    prompt = m.make_prompt([label] * rows, guided=sampling.guided)
    law = None
    for cell in [0, *schedule]:
        cache = m.new_slots_cache(rows, sampling.guided, N, 2)
        step = m.prefill_slots(cache, torch.arange(rows * (1 + sampling.guided)), prompt)
        if cell:
            src, pos, seen = schedule[cell]
            slot = pos if src == pos else N  # a stand-in input sits in the spare slot
            tokens = torch.cat([x[:, seen], x[:, src : src + 1]], 1)
            slots = torch.tensor([*seen, slot]).expand(rows, -1)
            positions = torch.tensor([*seen, pos]).expand(rows, -1)
            vis = torch.zeros(rows, len(seen) + 1, N + 2, dtype=torch.bool)
            vis[:, :, seen] = True
            vis[:, -1, slot] = True
            step = m.extend_slots(cache, *(expand_rows(t, sampling.guided) for t in (tokens, slots, positions, vis)))
        p = distribution(step.logits[:, -1], sampling, sampling.guided).double()
        factor = p.gather(-1, x[:, cell : cell + 1])[:, 0]
        law = factor if law is None else law * factor
    return dict(zip(seqs, law.tolist()))


@pytest.mark.slow  # ~10 s: 2^9 runs
def test_fixed_window_law_equals_the_hand_schedule():
    """The enumerated joint of s = 1 equals the law of the hand-written schedule (1e-12): each
    cell drawn from exactly the context ZipAR's schedule gives it, the stand-in row start included."""
    m = grid3()
    got, _, _ = spatial_joint(m, "zipar", SAMPLING, window=1)
    want = scheduled_law(m, list(got), 1, SAMPLING, S1_SCHEDULE)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    assert max(abs(got[k] - want[k]) for k in got) < 1e-12


def test_window_of_a_whole_row_is_ar_token_for_token():
    """s = W: every row starts once the row above is complete, from its true last token, and the
    draws come in raster order: AR's tokens, sampling and greedy, batch 1 and 3, fixed and adaptive."""
    m = grid3(vocab=16)
    labels = [0, 3, 5, 7, 1]
    for s in BATCH_SAMPLINGS + [SAMPLING]:
        ar = decode(m, labels, DecodeConfig.of("ar"), s, seed=4)
        for adaptive in (False, True):
            cfg = DecodeConfig.of("zipar", window=3, adaptive=adaptive)
            for B in (1, 3):
                out = decode(m, labels, cfg, s, seed=4, batch_size=B)
                assert torch.equal(out.tokens, ar.tokens), (s, adaptive, B)
                assert len(out.steps["step"]) == len(ar.steps["step"])


@pytest.mark.parametrize("knobs", [dict(window=1), dict(window=2), dict(window=1, adaptive=True)])
def test_float64_batch_three_equals_batch_one(knobs):
    """7 images through 3 slots (images finish at different steps; later ones take freed slots)."""
    from test_engine import _same_records

    m = grid3(vocab=16)
    labels = [0, 3, 5, 7, 1, 9, 4]
    cfg = DecodeConfig.of("zipar", **knobs)
    for s in BATCH_SAMPLINGS:
        one = decode(m, labels, cfg, s, seed=11, first_index=5)
        many = decode(m, labels, cfg, s, seed=11, first_index=5, batch_size=3)
        assert torch.equal(one.tokens, many.tokens), s
        _same_records(one, many)
        assert many.steps["active"].max() == 3


def test_fixed_schedule_forwards_by_hand():
    """3 x 3, s = 1: forwards 1-2 finish row 0; 3: (1,0); 4: (1,1), (2,0); 5: (1,2), (2,1); 6: (2,2).
    Six forwards after the prefill: 9 tokens / 7 forwards. s = 2: 1-2 row 0; 3: (1,0); 4: (1,1);
    5: (1,2), (2,0); 6: (2,1); 7: (2,2)."""
    m = grid3(vocab=16)
    s = SamplingConfig(guidance=1.0, temperature=1.0)
    for window, emitted in ((1, [1, 1, 1, 2, 2, 1]), (2, [1, 1, 1, 1, 2, 1, 1])):
        out = decode(m, [2], DecodeConfig.of("zipar", window=window), s, seed=0)
        assert out.steps["emitted"].tolist() == emitted
        assert int(out.images["target_forwards"][0]) == len(emitted) + 1
        assert out.settings["zipar_window"] == window and out.settings["method"] == "zipar"


def test_adaptive_row_start_records():
    """An adaptive row start is drafted at s_min and judged in every later forward until accepted:
    its draft rows sit at the row's first cell, were proposed by an earlier step, and a row start
    is committed by the forward that accepts it (or once the row above is complete)."""
    m = grid3(vocab=16)
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    out = decode(m, list(range(6)), DecodeConfig.of("zipar", window=1, adaptive=True), s, seed=3)
    d = out.drafts
    assert len(d["token"]) and set(d["position"].tolist()) == {6}  # only row 2 starts before its row above is done
    assert (d["proposed_step"] < d["step"]).all() and (d["depth"] == 1).all() and (d["sibling"] == 2).all()
    per_image = defaultdict(list)
    for img, acc in zip(d["image"], d["accepted"]):
        per_image[img].append(bool(acc))
    assert all(sum(v) <= 1 and (not v[-1] or sum(v) == 1) for v in per_image.values())
    ok = d["accepted"]
    assert np.allclose(d["accept_prob"][ok], np.minimum(1, d["p_draft"][ok] / d["q_draft"][ok]))


def test_greedy_zipar():
    """Greedy: deterministic argmaxes; the first two rows equal greedy AR's (their context is AR's),
    the last row follows its shorter context."""
    m = grid3(vocab=16)
    g = SamplingConfig(guidance=2.0, temperature=0.0)
    labels = list(range(8))
    ar = decode(m, labels, DecodeConfig.of("ar"), g)
    out = decode(m, labels, DecodeConfig.of("zipar", window=1), g)
    assert torch.equal(out.tokens[:, :6], ar.tokens[:, :6])
    assert not torch.equal(out.tokens, ar.tokens)  # the third row's argmaxes moved for some image


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="zipar", window=0), "--zipar-window"),
        (dict(method="pjd", rows=0), "--pjd-window"),
        (dict(method="pjd", offset=0), "--pjd-offset"),
        (dict(method="nope"), "unknown row-parallel method"),
        (dict(method="zipar", adaptive="yes"), "--zipar-mode"),
    ],
)
def test_bad_knobs_raise_usage_errors(kwargs, match):
    with pytest.raises(UsageError, match=match):
        SpatialConfig(**kwargs)


def test_models_it_cannot_run():
    m = grid3()
    check_spatial(SpatialConfig("zipar", window=3), m)
    with pytest.raises(UsageError, match="--zipar-window must be <= 3, the tokens per row of tiny; got 4"):
        check_spatial(SpatialConfig("zipar", window=4), m)
    with pytest.raises(UsageError, match="--pjd-window must be <= 3"):
        check_spatial(SpatialConfig("pjd", rows=4, offset=1), m)
    text = tiny(vocab=8, block=9)
    text.grid = (1, 9)
    with pytest.raises(UsageError, match="^--method zipar decodes the rows of an image grid in parallel, but tiny"):
        check_spatial(SpatialConfig("zipar"), text)
    m.eol_id = 5
    with pytest.raises(UsageError, match="inserts end-of-row tokens"):
        check_spatial(SpatialConfig("pjd", rows=2, offset=1), m)


def test_generate_cli(tmp_path, capsys):
    from lantern.generate import main

    for argv, match in (
        (["--method", "zipar", "--zipar-window", "0"], "--zipar-window"),
        (["--method", "zipar", "--zipar-window", "9"], "--zipar-window must be <= 8, the tokens per row of embedded"),
        (["--method", "ar", "--zipar-window", "2"], "--zipar-window does not apply to --method ar"),
        (["--method", "zipar", "--pjd-offset", "2"], "--pjd-offset does not apply to --method zipar"),
        (["--method", "zipar", "--model", "text-twin"], "has no 2-D token grid"),
    ):
        assert main(argv + ["--num-images", "1", "--out", str(tmp_path / "r"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and match in err[0], err
    out = tmp_path / "ok"
    argv = [
        "--method",
        "zipar",
        "--zipar-window",
        "2",
        "--zipar-mode",
        "adaptive",
        "--num-images",
        "2",
        "--batch-size",
        "2",
    ]
    assert main(argv + ["--out", str(out), "--no-progress"]) == 0
