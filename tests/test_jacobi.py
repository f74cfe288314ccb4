"""Jacobi decoding (lantern.methods.jacobi.method: SJD, GSD, SCD) on tiny random models.

* exhaustive enumeration of the real decoder (every coin, random initial token, residual and
  draft draw branched with its probability): SJD and SCD with maximal coupling give exactly the
  AR joint of an image's tokens (1e-12), with guidance, temperature, top-k and top-p;
  SCD with the official code's bookkeeping of kept drafts (``maximal-official``) does not (joint
  TVD 0.007 on a 5-token case), and GSD does not (power checks: the same enumeration);
* SCD with Gumbel coupling (continuous noise, not enumerable): a chi-square test of 4000 fixed-seed
  images against the exact AR joint;
* greedy SJD / SCD / GSD-with-group-1 equal greedy AR token for token, with CFG;
* hand-computed accept / reject cases of each rule; GSD's exact one-step output distribution;
* records (proposed_step, identities) and one-line errors for bad knobs;
* batched Jacobi decoding (decode(batch_size=B)): in float64 tokens and records equal batch 1's for
  SJD / GSD / SCD with CFG, temperature, top-k / top-p and greedy, images entering freed slots and
  finishing at different steps; streams independent of the batch; a draining batch; greedy equals
  greedy AR; one-token images; exact enumeration of a late-admitted SJD image; the generate CLI.
"""

import itertools
from collections import defaultdict

import numpy as np
import pytest
import torch
from reference.decode import decode_one_by_one
from reference.jacobi import jacobi_decode
from test_decoding import _chi2_pvalue
from test_trees import enumerate_outcomes, exact_joint, tiny

from ambiguity.errors import UsageError
from ambiguity.generation import sample_tokens
from ambiguity.sampling import SamplingConfig, distribution, expand_rows
from ambiguity.seeding import image_generator
from lantern.engine.decode import DecodeConfig, decode
from lantern.methods.jacobi.config import JacobiConfig, check_jacobi
from lantern.rules.divergences import tvd
from lantern.rules.jacobi import (
    JACOBI_RULES,
    WindowDrafts,
    entropy_acceptance,
    entropy_judge,
    entropy_threshold,
    group_at,
    group_masses,
    gsd_accept_prob,
    gsd_greedy,
    gsd_output_distribution,
    one_step_output,
    rank_keys,
    sjd_accept_prob,
    sjd_output_distribution,
    sjd_residual,
)


def _joint(m, config, sampling, label=1):
    stats = defaultdict(int)

    def run(draws):
        out = decode(m, [label], DecodeConfig(None, params=config), sampling, draws={0: draws})
        stats["accepted"] += int(out.steps["accepted"].sum())
        stats["rejected"] += int((out.drafts["reached"] & ~out.drafts["accepted"]).sum())
        return tuple(out.tokens[0].tolist())

    got, runs = enumerate_outcomes(run)
    return got, runs, stats


SAMPLINGS = [
    SamplingConfig(guidance=1.0, temperature=1.0, top_k=2),
    SamplingConfig(guidance=2.0, temperature=0.7, top_k=2),
    SamplingConfig(guidance=1.5, temperature=1.3, top_p=0.8),
]


@pytest.mark.slow  # ~10-20 s each on 2 shared cores: a few thousand enumerated runs
@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize(
    "config",
    [
        JacobiConfig("sjd", window=3),
        JacobiConfig("sjd", window=4, init="repeat-horizon"),
        JacobiConfig("scd", window=3, coupling="maximal"),
    ],
    ids=["sjd", "sjd-repeat", "scd-maximal"],
)
def test_sjd_and_scd_maximal_are_exactly_ar_sampling(config, sampling):
    """Every outcome of jacobi_decode weighted by its probability is the AR joint (V = 4, 2 x 2
    tokens, windows of 2-3 drafts: random initial drafts, kept drafts and rejections all occur)."""
    m = tiny()
    want = exact_joint(m, 1, sampling)
    got, runs, stats = _joint(m, config, sampling)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    assert set(got) <= set(want) and runs > 20
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), seq
    assert stats["accepted"] > 0 and stats["rejected"] > 0


def _max_gap(got, want):
    return max(abs(got.get(k, 0.0) - v) for k, v in want.items())


def _prefix_joint(model, label, s, n):
    """P(x_0..x_{n-1}) of AR sampling (the first n tokens of an image), by teacher forcing."""
    seqs = list(itertools.product(range(model.vocab_size), repeat=n))
    tokens = torch.tensor(seqs)
    prompt = model.make_prompt([label] * len(seqs), guided=s.guided)
    with torch.no_grad():
        logits = model.teacher_force(prompt, expand_rows(tokens, s.guided)).logits
    probs = distribution(logits, s, s.guided).double().gather(-1, tokens[..., None])[..., 0].prod(-1)
    return {seq: float(v) for seq, v in zip(seqs, probs) if v > 0}


@pytest.mark.slow  # ~70 s: 5 tokens with windows of 3 drafts, about 2000 runs per coupling
def test_maximal_coupling_bookkeeping():
    """Drafts coupled twice (a kept draft whose q came from an earlier target forward) need 5
    tokens and 3-draft windows (V = 2). Recording a kept draft with the p it is now distributed as
    (``maximal``) is exact; the official code's old q (``maximal-official``) moves the joint by a
    TVD of 0.007 here."""
    m = tiny(vocab=2, block=9, std=1.0)
    s = SamplingConfig(guidance=1.0, temperature=1.0)
    want = _prefix_joint(m, 1, s, 5)
    gaps = {}
    for coupling in ("maximal", "maximal-official"):
        cfg = JacobiConfig("scd", window=4, coupling=coupling)
        got, _ = enumerate_outcomes(
            lambda d, cfg=cfg: tuple(
                decode(m, [1], DecodeConfig(None, params=cfg), s, num_tokens=5, draws={0: d}).tokens[0].tolist()
            )
        )
        assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
        gaps[coupling] = sum(abs(got.get(k, 0.0) - v) for k, v in want.items()) / 2  # TVD of the joints
    assert gaps["maximal"] < 1e-12
    assert gaps["maximal-official"] == pytest.approx(0.00695, abs=5e-5)


@pytest.mark.slow
def test_gsd_is_not_ar_sampling():
    """Power check: the same enumeration moves the joint away from AR with GSD's grouped rule."""
    m = tiny()
    s = SAMPLINGS[0]
    want = exact_joint(m, 1, s)
    got, _, _ = _joint(m, JacobiConfig("gsd", window=3, group=4, prob_gap=1.0), s)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    assert _max_gap(got, want) > 1e-3


@pytest.mark.slow
def test_gsd_with_group_one_is_exactly_ar_sampling():
    m = tiny()
    want = exact_joint(m, 1, SAMPLINGS[2])
    got, _, _ = _joint(m, JacobiConfig("gsd", window=3, group=1), SAMPLINGS[2])
    assert max(abs(got.get(k, 0.0) - v) for k, v in want.items()) < 1e-12


@pytest.mark.slow
def test_scd_gumbel_matches_the_ar_joint_by_chi_square():
    """2000 images (fixed seeds, image i from stream (0, i)) of SCD with Gumbel coupling against the
    exact AR joint: p-value > 1e-3; the same test rejects GSD with a wide group (power)."""
    m = tiny()
    s = SamplingConfig(guidance=1.0, temperature=1.0, top_k=3)
    want = exact_joint(m, 1, s)
    seqs = sorted(want)
    probs = np.array([want[k] for k in seqs])

    def counts(config, n=2000):
        c = defaultdict(int)
        for i in range(n):
            out = decode(m, [1], DecodeConfig(None, params=config), s, seed=0, first_index=i)
            c[tuple(out.tokens[0].tolist())] += 1
        return np.array([c[k] for k in seqs])

    assert _chi2_pvalue(counts(JacobiConfig("scd", window=3)), probs) > 1e-3
    assert _chi2_pvalue(counts(JacobiConfig("gsd", window=3, group=4, prob_gap=1.0), 1000), probs) < 1e-3


@pytest.mark.slow
def test_seeded_streams_match_the_ar_joint_by_chi_square():
    """The generator path (one block of uniforms per step: an unreached draft's coin is SCD-maximal's
    coupling test, one inverse-CDF uniform per position), 3000 seeded images decoded 64 at a time:
    SCD maximal and SJD repeat-horizon pass a chi-square test against the exact AR joint."""
    m = tiny()
    s = SamplingConfig(guidance=1.0, temperature=1.0, top_k=3)
    want = exact_joint(m, 1, s)
    seqs = sorted(want)
    probs = np.array([want[k] for k in seqs])
    configs = (JacobiConfig("scd", window=3, coupling="maximal"), JacobiConfig("sjd", window=3, init="repeat-horizon"))
    for cfg in configs:
        out = decode(m, [1] * 3000, DecodeConfig(None, params=cfg), s, seed=0, batch_size=64)
        c = defaultdict(int)
        for row in out.tokens.tolist():
            c[tuple(row)] += 1
        assert _chi2_pvalue(np.array([c[k] for k in seqs]), probs) > 1e-3, cfg


# --------------------------------------------------------------------------- greedy
def test_greedy_jacobi_equals_greedy_ar():
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    accepted = 0
    for guidance, label in ((1.0, 0), (3.0, 5)):
        s = SamplingConfig(guidance=guidance, temperature=0.0)
        prompt = m.make_prompt([label], guided=s.guided)
        ar = sample_tokens(m, prompt, s)
        for cfg in (
            JacobiConfig("sjd", window=4),
            JacobiConfig("scd", window=6),
            JacobiConfig("gsd", window=4, group=1),
            JacobiConfig("sjd", window=5, init="repeat-horizon"),
            JacobiConfig("sjd", window=1),
        ):
            out = decode(m, [label], DecodeConfig(None, params=cfg), s)
            assert torch.equal(out.tokens, ar), (cfg, guidance)
            accepted += int(out.steps["accepted"].sum())
    assert accepted > 0


# --------------------------------------------------------------------------- hand cases
def test_sjd_rule_hand_cases():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
    q = torch.tensor([[0.25, 0.6, 0.0, 0.15]])
    got = [float(sjd_accept_prob(p, q, torch.tensor([x]))) for x in range(4)]
    assert got == pytest.approx([1.0, 0.5, 1.0, 0.0])  # p/q capped, q = 0 < p -> 1, p = 0 -> 0
    assert sjd_residual(p, q)[0].tolist() == pytest.approx([0.25 / 0.45, 0.0, 0.2 / 0.45, 0.0])
    point = torch.tensor([[0.0, 1.0, 0.0, 0.0]])  # an initialised draft: accepted with p(x), residual p without x
    assert float(sjd_accept_prob(p, point, torch.tensor([1]))) == pytest.approx(0.3)
    assert sjd_residual(p, point)[0].tolist() == pytest.approx([0.5 / 0.7, 0.0, 0.2 / 0.7, 0.0])
    assert sjd_residual(p, p)[0].tolist() == pytest.approx(p[0].tolist())  # no mass: p itself
    assert torch.allclose(sjd_output_distribution(p, q), p, atol=1e-7)


def test_gsd_group_hand_cases():
    # ascending order of p: 4 (0.02), 3 (0.08), 2 (0.1), 1 (0.3), 0 (0.5)
    p = torch.tensor([0.5, 0.3, 0.1, 0.08, 0.02])
    q = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])  # draft x = 2 drawn as a point mass
    pg, qg, cnt = group_masses(p, q, group=4, prob_gap=0.15)
    # x = 2 (rank 2): ranks 0..3 = tokens 4, 3, 2, 1; |p - 0.1| < 0.15 drops token 1 (0.2 away)
    assert float(pg[2]) == pytest.approx(0.02 + 0.08 + 0.1) and float(qg[2]) == 1.0 and int(cnt[2]) == 3
    assert float(gsd_accept_prob(pg[2], qg[2])) == pytest.approx(0.2)
    # x = 0 (top rank 4): ranks 2..4 (clipped) = tokens 2, 1, 0; only 0 within 0.15 of 0.5
    assert float(pg[0]) == pytest.approx(0.5) and int(cnt[0]) == 1
    # a wide gap keeps every rank of the window: x = 1 (rank 3) -> ranks 1..4
    pg, _, cnt = group_masses(p, q, group=4, prob_gap=1.0)
    assert float(pg[1]) == pytest.approx(0.08 + 0.1 + 0.3 + 0.5) and int(cnt[1]) == 4
    # group 1 is SJD
    pg, qg, cnt = group_masses(p, q, group=1, prob_gap=0.15)
    assert torch.equal(pg, p) and torch.equal(qg, q) and bool((cnt == 1).all())
    # the embedding filter: tokens 3 and 4 are far from 2
    emb = torch.tensor([[0.0], [0.1], [0.2], [5.0], [5.1]])
    pg, _, cnt = group_masses(p, q, group=4, prob_gap=1.0, embeddings=emb, distance=0.5)
    assert float(pg[2]) == pytest.approx(0.1 + 0.3) and int(cnt[2]) == 2


def test_gsd_output_distribution_exact():
    p = torch.tensor([0.5, 0.3, 0.1, 0.08, 0.02])
    q = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])
    out = gsd_output_distribution(p, q, group=4, prob_gap=0.15)
    # keep x = 2 with 0.2, else norm(max(p - q, 0)) = p without token 2, renormalised by 0.9
    want = torch.tensor([0.5, 0.3, 0.0, 0.08, 0.02]) * (0.8 / 0.9)
    want[2] = 0.2
    assert out.tolist() == pytest.approx(want.tolist())
    assert float(tvd(out, p)) == pytest.approx(0.1)  # the kept draft gets 0.2 instead of 0.1
    assert torch.allclose(gsd_output_distribution(p, q, 1, 0.15), p, atol=1e-7)
    # a batch of random (p, q): GSD moves mass, SJD does not; rows stay distributions
    g = torch.Generator().manual_seed(0)
    P = torch.softmax(torch.randn(64, 32, generator=g) * 2, -1)
    Q = torch.softmax(torch.randn(64, 32, generator=g) * 2, -1)
    out = gsd_output_distribution(P, Q, 14, 0.15)
    assert torch.allclose(out.sum(-1), torch.ones(64), atol=1e-6)
    assert float(tvd(out, P).mean()) > 1e-3
    assert float(tvd(sjd_output_distribution(P, Q), P).max()) < 1e-6


# --------------------------------------------------------------------------- records, wiring, errors
def test_records_and_decode_dispatch():
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    d = decode(m, [0, 3], DecodeConfig.of("sjd", window=4), s, seed=1)
    steps, drafts, images = d.frames()
    assert d.method == "sjd" and d.gamma == 3 and d.settings["jacobi_window"] == 4
    assert (images["target_forwards"] == 1 + images["steps"]).all()
    assert (steps.groupby("image")["emitted"].sum() + 1 == 16).all()
    assert (steps["drafter_forwards"] == 0).all() and (steps["drafted"] <= 3).all()
    # first step: every draft is an initialised position; later drafts were proposed by the previous step
    first = drafts[drafts["step"] == 1]
    assert (first["proposed_step"] == -1).all()
    kept = drafts[drafts["proposed_step"] >= 0]
    assert len(kept) and (kept["proposed_step"] == kept["step"] - 1).all()
    assert drafts["committed"].sum() == steps["accepted"].sum()
    # the same seed and condition give the same image whatever else is in the batch
    again = decode(m, [3], DecodeConfig.of("sjd", window=4), s, seed=1, first_index=1)
    assert torch.equal(again.tokens[0], d.tokens[1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="sjd", window=0), "--window"),
        (dict(method="gsd", group=0), "--gsd-group"),
        (dict(method="gsd", prob_gap=0.0), "--gsd-prob-gap"),
        (dict(method="scd", coupling="nope"), "--scd-coupling"),
        (dict(method="sjd", init="nope"), "--jacobi-init"),
        (dict(method="gsd", distance=-1.0), "--gsd-distance"),
        (dict(method="entropy-sd", entropy_alpha=0.0), "--entropy-alpha"),
        (dict(method="entropy-sd", entropy_floor=0.0), "--entropy-floor"),
        (dict(method="entropy-sd", entropy_floor=1.5), "--entropy-floor"),
    ],
)
def test_bad_knobs_raise_usage_errors(kwargs, match):
    with pytest.raises(UsageError, match=match):
        JacobiConfig(**kwargs)


def test_methods_a_model_cannot_run():
    m = tiny(vocab=8, block=16)
    check_jacobi(JacobiConfig("sjd", window=16), m)  # a window of the whole image (4 x 4 tokens)
    with pytest.raises(UsageError, match="--window must be <= 16, the tokens per image of tiny; got 17"):
        check_jacobi(JacobiConfig("sjd", window=17), m)
    with pytest.raises(UsageError, match="--gsd-group 9 exceeds the vocabulary size 8"):
        check_jacobi(JacobiConfig("gsd", group=9), m)

    class NoEmbeddings(type(m)):
        def input_embeddings(self):
            raise NotImplementedError

    m.__class__ = NoEmbeddings
    with pytest.raises(UsageError, match="--gsd-distance needs the input embeddings"):
        check_jacobi(JacobiConfig("gsd", group=4, distance=0.5), m)


def test_generate_cli_rejects_bad_jacobi_knobs(tmp_path, capsys):
    from lantern.generate import main

    for argv, match in (
        (["--method", "sjd", "--window", "0"], "--window"),
        (["--method", "gsd", "--gsd-group", "5000"], "--gsd-group 5000 exceeds the vocabulary"),
        (["--method", "sjd", "--window", "100000"], "--window must be <= 64, the tokens per image of embedded"),
        (["--method", "sjd", "--window", "fast"], "must be an integer >= 1 or auto, got 'fast'"),
        (["--method", "sjd", "--window-max", "8"], "--window-max does not apply without --window auto; drop it"),
        (["--method", "sjd-pac", "--window", "auto"], "give sjd-pac --window N"),
        (["--method", "sjd", "--window", "auto", "--window-max", "0"], "--window (tokens per Jacobi forward)"),
    ):
        assert main(argv + ["--num-images", "1", "--out", str(tmp_path / "r"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and match in err[0], err


def test_window_auto_from_the_command_line():
    """``--window auto`` turns on the window policy with the method's window (or ``--window-max``) as
    the longest; the record says so."""
    from lantern.generate import build_parser, decode_config_from_args

    def config(*argv):
        return decode_config_from_args(build_parser().parse_args(["--method", "sjd", *argv])).params

    assert (config("--window", "auto").auto, config("--window", "auto").window) == (True, 16)
    assert config("--window", "auto", "--window-max", "8").window == 8
    assert (config("--window", "8").auto, config().window) == (False, 16)
    assert config("--window", "auto").as_dict()["jacobi_window_auto"] is True


def test_histogram_text_stays_short():
    """The accepted-drafts histogram generate prints: whole up to 17 entries, else cut after the
    last non-zero count with the counts from 16 on summed."""
    from lantern.generate import histogram_text

    assert histogram_text([1, 2, 0, 0, 0]) == "(0..4): [1, 2, 0, 0, 0]"  # a chain of γ = 4: every entry
    assert histogram_text([3, 1] + [0] * 99_999) == "(0..1): [3, 1]"
    assert (
        histogram_text(list(range(20)) + [0] * 30) == "(0..19): [" + ", ".join(map(str, range(16))) + ", 70 at 16..19]"
    )


def test_gumbel_coupling_samples_p_and_repeats_at_a_position():
    """SCD's Gumbel-max (argmax p exp(g), one noise vector per position): over many positions the
    token follows p (chi-square); at one position the same p gives the same token again, and a
    nearby p usually does (that is the coupling); it is argmax(log p + g) token for token."""
    from lantern.methods.jacobi.method import gumbel_max, race_weights

    p = torch.tensor([0.5, 0.25, 0.15, 0.1], dtype=torch.float64)
    near = torch.tensor([0.45, 0.3, 0.15, 0.1], dtype=torch.float64)
    u = torch.rand(4000, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    w = race_weights(u)
    first = gumbel_max(p.expand(4000, 4), w)
    assert _chi2_pvalue(np.bincount(first.numpy(), minlength=4), p.numpy()) > 1e-3
    assert torch.equal(first, (p.log() - torch.log(-torch.log(u))).argmax(-1))
    assert torch.equal(gumbel_max(p.expand(4000, 4), w), first)
    same = float((gumbel_max(near.expand(4000, 4), w) == first).double().mean())
    assert same > 0.9  # independent draws would agree with probability sum p * near = 0.36
    assert float(race_weights(torch.tensor([0.5], dtype=torch.float64))) == pytest.approx(1 / np.log(2))


def test_generate_cli_runs_scd(tmp_path, capsys):
    """``python -m lantern.generate --method scd`` on the shipped embedded model: records and summary."""
    import json

    import pandas as pd

    from lantern.generate import main

    out = tmp_path / "scd"
    assert main(["--method", "scd", "--window", "8", "--num-images", "1", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "scd" and summary["rule"]["jacobi_window"] == 8
    assert summary["rule"]["scd_coupling"] == "gumbel" and summary["tokens"] == 64
    assert summary["tokens_per_forward"] > 1
    drafts = pd.read_parquet(out / "drafts.parquet")
    assert (drafts["proposed_step"] >= -1).all() and (drafts["proposed_step"] < drafts["step"]).all()


# --------------------------------------------------------------------------- batched Jacobi decoding
BATCHED = [
    JacobiConfig("sjd", window=4),
    JacobiConfig("sjd", window=5, init="repeat-horizon"),
    JacobiConfig("gsd", window=4, group=5, prob_gap=0.3),
    JacobiConfig("scd", window=5),  # Gumbel coupling: noise per absolute position from the image's stream
    JacobiConfig("scd", window=3, coupling="maximal"),
    JacobiConfig("entropy-sd", window=4, entropy_alpha=1.0, entropy_floor=0.3),
]
BATCH_SAMPLINGS = [
    SamplingConfig(guidance=1.0, temperature=1.0),
    SamplingConfig(guidance=3.0, temperature=0.8, top_k=12),
    SamplingConfig(guidance=2.0, temperature=1.2, top_p=0.9),
    SamplingConfig(guidance=2.0, temperature=0.0),
]


@pytest.mark.parametrize("config", BATCHED, ids=lambda c: f"{c.method}-{c.init}-{c.coupling}")
def test_float64_batched_jacobi_equals_batch_one(config):
    """7 images through 3 slots (continuous batching: images finish at different batch steps and
    later ones take the freed slots): tokens and every non-timing record equal batch 1's."""
    from test_engine import _same_records

    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    labels = [0, 3, 5, 7, 1, 9, 4]
    cfg = DecodeConfig(None, params=config)
    ragged = spread = 0
    for s in BATCH_SAMPLINGS:
        one = decode_one_by_one(m, labels, cfg, s, seed=11, first_index=5)  # the reference loop
        single = decode(m, labels, cfg, s, seed=11, first_index=5)
        many = decode(m, labels, cfg, s, seed=11, first_index=5, batch_size=3)
        assert torch.equal(one.tokens, single.tokens) and torch.equal(one.tokens, many.tokens), s
        _same_records(one, single)
        _same_records(one, many)
        steps = many.steps
        assert steps["active"].max() == 3 and (many.images["image"] == np.arange(5, 12)).all()
        assert many.method == config.method and many.gamma == config.window - 1
        last = {i: steps["batch_step"][steps["image"] == i].max() for i in range(5, 12)}
        first = {i: steps["batch_step"][steps["image"] == i].min() for i in range(5, 12)}
        assert max(first.values()) > 1  # some images entered a freed slot later
        by_batch = {}
        for b, pos in zip(steps["batch_step"], steps["position"]):
            by_batch.setdefault(b, set()).add(pos)
        ragged += sum(len(v) > 1 for v in by_batch.values())
        spread += len(set(last.values())) > 1
    assert ragged > 0 and spread > 0  # images sat at different positions in one forward, finished at different steps


def test_batched_jacobi_images_keep_their_streams_and_drain(monkeypatch):
    """An image's tokens do not depend on its batch, slot or admission step; a draining batch drops
    its empty slots (CFG: two cache rows per image) and still gives batch 1's tokens."""
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    kept = []
    select = type(m).select_slots
    monkeypatch.setattr(
        type(m), "select_slots", lambda self, cache, rows: (kept.append(len(rows)), select(self, cache, rows))[1]
    )
    s = SamplingConfig(guidance=2.0, temperature=1.0, top_k=16)
    cfg = JacobiConfig("scd", window=4)
    full = decode(m, list(range(9)), DecodeConfig(None, params=cfg), s, batch_size=4, seed=4)
    part = decode(m, [6, 3], DecodeConfig(None, params=cfg), s, batch_size=2, seed=4, indices=[6, 3])
    assert torch.equal(part.tokens, full.tokens[[6, 3]])
    assert kept and all(k % 2 == 0 and k <= 4 for k in kept)
    one = torch.cat(
        [
            jacobi_decode(m, m.make_prompt([c], guided=True), s, cfg, image_generator(4, c), image=c).tokens
            for c in range(9)
        ]
    )
    assert torch.equal(one, full.tokens)


def test_greedy_batched_jacobi_equals_greedy_ar():
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    labels = [2, 6, 8, 0, 3]
    for guidance, method in itertools.product((1.0, 3.0), ("sjd", "scd")):
        s = SamplingConfig(guidance=guidance, temperature=0.0)
        out = decode(m, labels, DecodeConfig.of(method, window=6), s, batch_size=2)
        ar = torch.cat([sample_tokens(m, m.make_prompt([c], guided=s.guided), s) for c in labels])
        assert torch.equal(out.tokens, ar), (guidance, method)


def test_batched_jacobi_short_images():
    """Images of 1, 2 and 5 tokens (num_tokens): one-token images finish at their prefill and free
    their slot at once; the tokens equal batch 1's."""
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    for N in (1, 2, 5):
        cfg = DecodeConfig.of("sjd", window=4)
        one = decode(m, [1, 2, 3, 4, 5], cfg, s, seed=2, num_tokens=N)
        many = decode(m, [1, 2, 3, 4, 5], cfg, s, seed=2, num_tokens=N, batch_size=2)
        assert torch.equal(one.tokens, many.tokens) and many.tokens.shape == (5, N)
        assert list(many.images["steps"]) == list(one.images["steps"])


@pytest.mark.slow  # ~1 min: every branch is a batched decode of 3 images
def test_exact_batched_sjd_is_ar_sampling_for_a_late_image():
    """Every random outcome of image 2 of a batched SJD decode (3 images in 2 slots: it takes a
    freed slot at a later batch step, next to an image at another position; the other images draw
    from their own streams), weighted by its probability, is exactly the AR joint."""
    m = tiny()
    s = SamplingConfig(guidance=2.0, temperature=0.7, top_k=2)
    want = exact_joint(m, 1, s)
    late, seen = [], {"accepted": 0, "rejected": 0}

    def run(draws):
        out = decode(
            m, [1, 2, 1], DecodeConfig(None, params=JacobiConfig("sjd", window=3)), s, batch_size=2, draws={2: draws}
        )
        mine = out.steps["image"] == 2
        late.append(out.steps["batch_step"][mine].min() > 1)
        seen["accepted"] += int(out.steps["accepted"][mine].sum())
        seen["rejected"] += int((out.drafts["reached"] & ~out.drafts["accepted"])[out.drafts["image"] == 2].sum())
        return tuple(out.tokens[2].tolist())

    got, runs = enumerate_outcomes(run)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12) and runs > 10 and all(late)
    assert seen["accepted"] > 0 and seen["rejected"] > 0
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), seq


def test_jacobi_config_checks_on_the_engine():
    s = SamplingConfig(guidance=1.0, temperature=1.0)
    with pytest.raises(UsageError, match="--batch-size .* must be an integer >= 1"):
        decode(tiny(), [1], DecodeConfig.of("sjd"), s, batch_size=0)
    m = tiny(vocab=32, block=16, dim=32, std=0.5)

    class NoBatch(type(m)):
        can_batch_decode = False

    plain = NoBatch.__new__(NoBatch)
    plain.__dict__.update(m.__dict__)
    s = SamplingConfig(guidance=1.0, temperature=1.0)
    with pytest.raises(UsageError, match="cannot decode on the slot engine"):
        decode(plain, [1, 2], DecodeConfig.of("sjd"), s, batch_size=1)
    with pytest.raises(UsageError, match="--gsd-group 40 exceeds the vocabulary size 32"):
        decode(m, [1, 2], DecodeConfig.of("gsd", group=40), s, batch_size=2)


def test_generate_cli_batches_jacobi(tmp_path, capsys):
    """``lantern.generate --method gsd --batch-size 3`` on the shipped embedded model in float64:
    the same images (codes) and per-image steps as ``--batch-size 1``."""
    import pandas as pd

    from lantern.generate import main

    runs = {}
    for b in (1, 3):
        out = tmp_path / f"b{b}"
        argv = ["--method", "gsd", "--window", "6", "--batch-size", str(b), "--num-images", "4", "--dtype", "float64"]
        assert main(argv + ["--out", str(out), "--no-progress"]) == 0
        runs[b] = pd.read_parquet(out / "images.parquet").sort_values("image")
    assert [list(c) for c in runs[1]["codes"]] == [list(c) for c in runs[3]["codes"]]
    assert runs[1]["steps"].tolist() == runs[3]["steps"].tolist()
    steps = pd.read_parquet(tmp_path / "b3" / "steps.parquet")
    assert steps["active"].max() == 3


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_float64_batched_jacobi_equals_batch_one_on_cuda():
    """The same exactness on a GPU: per-image CUDA generators, in-place cache writes, masks."""
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    m.gpt.cuda()
    m.device, m.image_token_ids = torch.device("cuda"), m.image_token_ids.cuda()
    s = SamplingConfig(guidance=2.0, temperature=1.0, top_k=12)
    for method in ("sjd", "gsd", "scd"):
        cfg = DecodeConfig.of(method, window=5)
        one = decode(m, [0, 3, 5, 7, 1], cfg, s, seed=3)
        many = decode(m, [0, 3, 5, 7, 1], cfg, s, seed=3, batch_size=2)
        assert torch.equal(one.tokens, many.tokens), method


# --------------------------------------------------------------------------- the rule table, entropy-aware SJD
def test_group_at_equals_group_masses_at_the_drafts():
    """GSD's group at the drafts (two top-k's over exact rank keys in float32, a stable sort in
    float64) is group_masses gathered at the drafts, bit for bit, with ties (zeros) in p; the greedy
    group test is the reference loop's."""
    g = torch.Generator().manual_seed(1)
    for V, group, gap in ((16, 14, 0.15), (32, 4, 1.0), (8, 8, 0.3), (300, 14, 0.15)):
        P = torch.softmax(torch.randn(5, 3, V, generator=g) * 3, -1)
        P[0, :, : V // 2] = 0.0
        P = P / P.sum(-1, keepdim=True)
        Q = torch.softmax(torch.randn(5, 3, V, generator=g) * 3, -1)
        x = torch.randint(0, V, (5, 3), generator=g)
        for dtype in (torch.float32, torch.float64):
            p, q = P.to(dtype), Q.to(dtype)
            want = [t.gather(-1, x[..., None])[..., 0] for t in group_masses(p, q, group, gap)]
            got = group_at(p, q, x, group, gap)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (V, dtype)
        keys = rank_keys(P)
        assert torch.equal(keys.argsort(-1), torch.sort(P, dim=-1, stable=True).indices)
        cfg = JacobiConfig("gsd", group=group, prob_gap=gap)
        d = WindowDrafts(x, Q, torch.zeros_like(x, dtype=torch.bool))
        top = P.argmax(-1)
        for b, j in itertools.product(range(5), range(3)):
            order = torch.sort(P[b, j], stable=True).indices.tolist()
            r, rt = order.index(int(x[b, j])), order.index(int(top[b, j]))
            lo = r - group // 2
            want = int(x[b, j]) == int(top[b, j]) or (
                lo <= rt < lo + group and abs(float(P[b, j, top[b, j]] - P[b, j, x[b, j]])) < gap
            )
            assert bool(gsd_greedy(P, d, cfg)[b, j]) == want


def test_entropy_rule_hand_cases():
    """tau(H) = max(floor, exp(-H / alpha)); a draft is kept with min(1, p(x) / (tau q(x)))."""
    alpha, floor = 3.0, 0.5
    assert float(entropy_threshold(torch.tensor(0.0), alpha, floor)) == 1.0  # certain: SJD
    tau2 = np.exp(-np.log(2) / 3)  # two equal tokens: H = log 2, tau = 2^(-1/3) = 0.7937
    assert float(entropy_threshold(torch.tensor(np.log(2)), alpha, floor)) == pytest.approx(tau2)
    assert float(entropy_threshold(torch.tensor(np.log(16)), alpha, floor)) == 0.5  # 16^(-1/3) = 0.397 < floor
    p = torch.tensor([[[0.5, 0.5, 0.0, 0.0]]], dtype=torch.float64)
    q = torch.tensor([[[0.2, 0.8, 0.0, 0.0]]], dtype=torch.float64)
    for tok, point, want in ((0, True, 0.5 / tau2), (1, False, 0.5 / tau2 / 0.8), (0, False, 1.0), (2, True, 0.0)):
        d = WindowDrafts(torch.tensor([[tok]]), q, torch.tensor([[point]]))
        cols = entropy_judge(p, d, JacobiConfig("entropy-sd"))
        assert float(cols["accept_prob"]) == pytest.approx(want)
        assert float(cols["p_tilde"]) == pytest.approx(float(p[0, 0, tok]) / tau2)
    # one step from a point-mass draft x = 0: kept with 0.63, else the residual (token 1)
    point = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    out = one_step_output(p[0, 0], point, entropy_acceptance(p[0, 0], point, alpha, floor))
    assert out.tolist() == pytest.approx([0.5 / tau2, 1 - 0.5 / tau2, 0.0, 0.0])
    assert float(tvd(out, p[0, 0])) == pytest.approx(0.5 / tau2 - 0.5)  # 0.130
    # floor 1 is SJD: lossless
    P = torch.softmax(torch.randn(16, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64), -1)
    Q = torch.softmax(torch.randn(16, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64), -1)
    assert torch.allclose(one_step_output(P, Q, entropy_acceptance(P, Q, alpha, 1.0)), P, atol=1e-12)
    assert JACOBI_RULES["entropy-sd"].greedy_is_ar and not JACOBI_RULES["entropy-sd"].lossless


@pytest.mark.slow  # ~15 s: every branch of a 3-token decode
def test_entropy_sd_one_step_law_by_enumeration():
    """Every outcome of the real decoder (window 2: one random draft at position 1, V = 4, top-k 3):
    the law of x_1 given x_0 is exactly the one-step output of the entropy rule averaged over the
    uniform initial draft, 0.0149 from p in total variation at worst (alpha 1, floor 0.2); SJD's is p."""
    m = tiny()
    s = SamplingConfig(guidance=1.0, temperature=1.0, top_k=3)
    V = m.vocab_size
    ar = _prefix_joint(m, 1, s, 2)
    first = _prefix_joint(m, 1, s, 1)
    gaps = {}
    entropy_sd = JacobiConfig("entropy-sd", window=2, entropy_alpha=1.0, entropy_floor=0.2)
    for cfg in (entropy_sd, JacobiConfig("sjd", window=2)):
        got, _ = enumerate_outcomes(
            lambda d, cfg=cfg: tuple(
                decode(m, [1], DecodeConfig(None, params=cfg), s, num_tokens=3, draws={0: d}).tokens[0].tolist()
            )
        )
        pair = defaultdict(float)
        for seq, prob in got.items():
            pair[seq[:2]] += prob
        worst = 0.0
        for (x0,), p0 in first.items():
            p1 = torch.tensor([ar.get((x0, y), 0.0) / p0 for y in range(V)], dtype=torch.float64)
            points = torch.eye(V, dtype=torch.float64)
            if cfg.method == "sjd":
                want = p1
            else:
                acc = entropy_acceptance(p1.expand(V, V), points, cfg.entropy_alpha, cfg.entropy_floor)
                want = one_step_output(p1.expand(V, V), points, acc).mean(0)
            law = torch.tensor([pair.get((x0, y), 0.0) / p0 for y in range(V)], dtype=torch.float64)
            assert torch.allclose(law, want, atol=1e-12), (cfg.method, x0)
            worst = max(worst, float(tvd(law, p1)))
        gaps[cfg.method] = worst
    assert gaps["sjd"] < 1e-12 and gaps["entropy-sd"] == pytest.approx(0.01492, abs=5e-5), gaps


def test_greedy_entropy_sd_equals_greedy_ar():
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    labels = [2, 6, 8]
    s = SamplingConfig(guidance=3.0, temperature=0.0)
    out = decode(m, labels, DecodeConfig.of("entropy-sd", window=5), s, batch_size=2)
    ar = torch.cat([sample_tokens(m, m.make_prompt([c], guided=s.guided), s) for c in labels])
    assert torch.equal(out.tokens, ar) and int(out.steps["accepted"].sum()) > 0
    assert out.settings["entropy_alpha"] == 3.0 and out.settings["entropy_floor"] == 0.7


def test_inverse_cdf_hand_cases_and_invert():
    """Two-level inverse CDF: the first token whose cumulative mass exceeds u * total (blocks of 2
    here, with an empty block skipped), zero-mass tokens never drawn, the same tokens as the flat
    float64 ambiguity.sampling.invert on random rows."""
    from ambiguity.sampling import invert
    from lantern.methods.jacobi.method import inverse_cdf

    p = torch.tensor([0.1, 0.2, 0.0, 0.0, 0.3, 0.4, 0.0])
    u = torch.tensor([0.0, 0.05, 0.15, 0.31, 0.35, 0.65, 0.95, 1 - 2**-53, 1.0], dtype=torch.float64)
    got = inverse_cdf(p.expand(len(u), 7), u, block=2).tolist()
    assert got == [0, 0, 1, 4, 4, 5, 5, 5, 5]  # even u = 1 (outside [0, 1)) draws a token with mass
    assert inverse_cdf(2 * p.expand(len(u), 7), u, block=2).tolist() == got  # any scale
    g = torch.Generator().manual_seed(0)
    for V in (5, 256, 1000, 16384):
        P = torch.softmax(torch.randn(300, V, generator=g) * 3, -1)
        P[:, ::3] = 0.0
        U = torch.rand(300, generator=g, dtype=torch.float64)
        tok = inverse_cdf(P, U)
        assert torch.equal(tok, invert(P, U)) and bool((P.gather(-1, tok[:, None]) > 0).all())
