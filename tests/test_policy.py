"""The draft-length policy of chains (lantern.engine.policy, ``gamma="auto"``).

* the expected accepted drafts of a chain and the policy's choice of G, hand-computed;
* the acceptance predictor: a saturated logistic fit reproduces the observed acceptance rates,
  and a missing file is one line naming the command that rebuilds it;
* the cost model: a linear fit of hand-made points, cached as JSON (a second call measures nothing);
* exact enumeration of the real engine with the policy active: at δ = 0 (and ``sd``) the joint
  distribution of an image's tokens equals AR sampling (1e-12), with rounds of every length
  0..γ_max (plain AR steps, early stops and full chains).
"""

import json

import numpy as np
import pytest
import torch
from test_trees import enumerate_outcomes, exact_joint, tiny

import lantern.engine.policy as policy
from ambiguity.errors import FieldError, UsageError
from ambiguity.neighbourhood import build_neighbourhoods
from ambiguity.sampling import SamplingConfig
from lantern.calibrate import lagged
from lantern.drafter.model import Drafter
from lantern.engine.decode import DecodeConfig, decode
from lantern.engine.policy import (
    AcceptancePredictor,
    CostModel,
    GammaPolicy,
    fit_predictor,
    load_predictor,
    save_predictor,
)
from lantern.methods.tree.spec import TreeSpec
from lantern.rules.acceptance import AcceptanceRule


def _always(a: float) -> AcceptancePredictor:
    """A predictor that says ``a`` whatever the distributions (logit of a, no slopes)."""
    return AcceptancePredictor((float(np.log(a / (1 - a))), 0.0, 0.0, 0.0), 0.5)


def _flat(target: float, drafter: float) -> CostModel:
    """A cost model in which a target forward takes ``target`` s and a drafter step ``drafter`` s
    whatever the rows and tokens."""
    return CostModel(((1, target, 0.0),), ((1, drafter, 0.0),))


def test_the_policy_maximises_expected_tokens_per_second():
    """One image, a = 1/2, target 1 s a forward, a drafter step d s: G tokens cost 1 + G d and
    bring 1 + sum_{j<=G} 2^-j. d = 0.25: rates 1, 1.2, 1.1667, 1.0714 -> G = 1; d = 0.6: G = 0;
    free drafting: the longest chain allowed (cap 3)."""
    stats, caps = np.array([[0.5, 1.0]]), np.array([3])
    for d, want in ((0.25, 1), (0.6, 0), (0.0, 3)):
        pol = GammaPolicy(_always(0.5), 3, _flat(1.0, d))
        assert pol.plan(stats, caps, rows=1) == want, d
    pol = GammaPolicy(_always(0.9), 8, _flat(1.0, 0.25))
    assert pol.plan(stats, np.array([2]), rows=1) == 2  # the cap binds
    assert pol.plan(stats, np.array([0]), rows=1) == 0  # the last token of an image is never drafted
    # while drafting (a draft's acceptance: ~1 when its top-1 is 0.9, ~0 at 0.1; no depth term): one sure draft
    # gives 2 tokens in 1.25 s (1.6 a second), one more adds ~1 token for 0.25 s: go on; a hopeless
    # draft adds nothing: stop; the cap (3) stops the third
    pol = GammaPolicy(AcceptancePredictor((-20.0, 0.0, 0.0, 40.0), 0.5), 3, _flat(1.0, 0.25))
    assert pol.plan(stats, caps, rows=1) == 1  # before drafting a = sigmoid(0) = 1/2: G = 1 as above
    assert pol.go_on(np.array([0.9])) and pol.go_on(np.array([0.9])) and not pol.go_on(np.array([0.9]))
    pol.plan(stats, caps, rows=1)
    assert not pol.go_on(np.array([0.1]))


def test_speculation_is_off_where_even_the_most_likely_acceptance_cannot_pay():
    """The predictor's most likely acceptance over distributions on K = 4 codes: weights (w0 .. w4)
    = (-1, 2, 0.5, -3, -0.25) reward the top-1 p1 and the entropy H; the largest 2 p1 + 0.5 H over
    all distributions is 0.5 ln(e^(2 / 0.5) + K - 1) (Gibbs' variational principle; its maximiser
    puts e^4 / (e^4 + 3) = 0.948 on one code, so that code is the top-1), and q's top-1 sits at 0
    (negative slope): sigmoid(-1 + 0.5 ln(e^4 + 3) - 0.25 d) at depth d. Target forward 1 s,
    drafter step d s: at a = 1/2 (no slopes) one draft brings 1.5 tokens for 1 + d s, so drafting
    pays for d < 0.5 only."""
    pol = GammaPolicy(AcceptancePredictor((-1.0, 2.0, 0.5, -3.0, -0.25), 0.5), 3, _flat(1.0, 0.1), np.log(4.0))
    z = -1.0 + 0.5 * np.log(np.exp(4.0) + 3.0) - 0.25 * np.arange(1, 4)
    assert np.allclose(pol.most_likely(), 1 / (1 + np.exp(-z)), rtol=1e-6)
    for d, may in ((0.4, True), (0.6, False)):
        assert GammaPolicy(_always(0.5), 3, _flat(1.0, d)).may_draft(rows=4) is may, d


def test_after_plain_steps_the_policy_rests_longer():
    """Plans that keep choosing G = 0 (a drafter step costs 0.6 of a target forward at a = 1/2) are
    followed by 1, 3, then 7 plain rounds without a plan; the last round of a rest computes the
    statistics the next plan reads ("rs"). A plan that drafts ends the rest."""
    stats, caps = np.array([[0.5, 1.0]]), np.array([3])
    pol, pattern = GammaPolicy(_always(0.5), 3, _flat(1.0, 0.6)), []
    for _ in range(20):
        pattern.append(("rs" if pol.plans_next() else "r") if pol.resting() else pol.plan(stats, caps, rows=1))
    assert pattern == [0, "rs", 0, "r", "r", "rs", 0] + ["r"] * 6 + ["rs", 0] + ["r"] * 5
    pol.costs = _flat(1.0, 0.25)
    pol._rounds = {}
    assert pol.plan(stats, caps, rows=1) == 1 and not pol.resting()


def test_positions_the_drafter_has_not_read_make_a_draft_dearer():
    """a = 1/2, a target forward 1 s, a drafter forward 0.1 + 0.05 T s over T positions, its steps
    after the first over one (0.15 s). The drafter's first forward reads 2 positions (0.2 s): G = 1,
    2, 3 bring 1.5, 1.75, 1.875 tokens in 1.2, 1.35, 1.5 s (1.25, 1.30, 1.25 a second; AR 1): G = 2.
    After AR rounds it reads 12 (0.5 s more): 0.88, 0.95, 0.94 a second, so a plain AR step."""
    costs = CostModel(((1, 1.0, 0.0),), ((1, 0.1, 0.05),))
    pol = GammaPolicy(_always(0.5), 3, costs)
    stats, caps = np.array([[0.5, 1.0]]), np.array([3])
    assert costs.catch_up_s(1, 12) == pytest.approx(0.5)
    assert pol.plan(stats, caps, rows=1) == 2 and pol.plan(stats, caps, rows=1, pending=12) == 0


def test_a_saturated_logistic_fit_reproduces_the_observed_rates():
    """Five affinely independent feature points (5 coefficients): the maximum-likelihood fit
    predicts exactly each point's share of accepted drafts (1/4, 1/2, 3/4, 1/5, 2/3); drafts not
    reached (after a rejection) do not count."""
    points = [(0.2, 1.0, 0.3, 1), (0.5, 0.5, 0.3, 2), (0.9, 0.2, 0.6, 1), (0.4, 2.0, 0.9, 3), (0.3, 0.7, 0.5, 4)]
    counts = [(1, 4), (2, 4), (3, 4), (1, 5), (2, 3)]
    rows = {c: [] for c in ("p_top1", "p_entropy", "q_top1", "depth", "accepted", "reached")}
    for (pt, pe, qt, dp), (ok, n) in zip(points, counts):
        for i in range(n + 2):
            for c, v in zip(("p_top1", "p_entropy", "q_top1", "depth"), (pt, pe, qt, dp)):
                rows[c].append(v)
            rows["accepted"].append(i < ok)
            rows["reached"].append(i < n)  # two unreached drafts per point, one of them "accepted"
    pred = fit_predictor(rows)
    got = pred.prob(*np.array(points).T)
    assert np.allclose(got, [ok / n for ok, n in counts], atol=1e-8)
    with pytest.raises(UsageError, match="single outcome"):
        fit_predictor({**rows, "accepted": [True] * len(rows["accepted"])})


def test_predictor_files(tmp_path, monkeypatch):
    """A predictor per calibrated rule, shipped next to the drafter; ``gamma="auto"`` reads its rule's
    (``sd``) or LANTERN's (the other rules); a missing one names the command that fits it."""
    pred = AcceptancePredictor((0.1, 2.0, -0.5, 1.0, -0.2), 0.4, {"images": 3})
    path = save_predictor(pred, tmp_path / "p.json")
    assert load_predictor(path, "embedded") == pred
    with pytest.raises(UsageError, match=r"missing; rebuild it with: python -m lantern.calibrate --model m$"):
        load_predictor(tmp_path / "none.json", "m")
    assert policy.predictor_path("embedded").name == "embedded_drafter_acceptance.json"
    sd = policy.predictor_path("embedded", "sd")
    assert sd.name == "embedded_drafter_acceptance_sd.json" and load_predictor(sd, "embedded").info["method"] == "sd"
    with pytest.raises(UsageError, match=r"calibrate --model m --method sd$"):
        load_predictor(tmp_path / "m_drafter_acceptance_sd.json", "m")
    read = []
    monkeypatch.setattr("lantern.methods.registry.load_predictor", lambda path, name: read.append(path.name) or pred)
    from lantern.methods.registry import _drafted

    for rule in (AcceptanceRule("sd"), AcceptanceRule("lantern++", k=2, delta=0.1)):
        _drafted(DecodeConfig(rule, "auto", gamma_max=2), tiny(), None, None)
    assert read == ["tiny_drafter_acceptance_sd.json", "tiny_drafter_acceptance.json"]
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UsageError, match=r"bad.json is unreadable .*python -m lantern.calibrate --model m$"):
        load_predictor(tmp_path / "bad.json", "m")


def test_cost_model_fit_and_cache(tmp_path, monkeypatch):
    """Points on s = 0.01 + 0.002 rows tokens give that line at every row count (measured or
    interpolated); the JSON cache answers the second call for the same model, and a larger batch
    measures only its own rows."""
    calls = []

    def fake(model, drafter, sampling, rows, tokens, rule, table):
        calls.append(list(rows))
        line = lambda R, T: 0.01 + 0.002 * R * T if T > 1 else 0.001 * R  # one token a row: no mask, off the line
        return {
            "target": {f"{2 * R},{T}": line(2 * R, T) for R in rows for T in tokens},
            "drafter": {f"{2 * R},{T}": 0.001 * 2 * R * T for R in rows for T in (1, 2)},
        }

    monkeypatch.setattr(policy, "measure_costs", fake)
    m, s = tiny(), SamplingConfig(guidance=2.0)
    c = policy.cost_model(m, None, s, 1, 4, AcceptanceRule("lantern", k=2), cache_dir=tmp_path)
    assert np.allclose(c.target, [(2, 0.01, 0.004)]) and np.allclose(c.drafter, [(2, 0.0, 0.002)], atol=1e-12)
    assert c.round_s(2, 3) == pytest.approx(0.01 + 0.002 * 8 + 0.004 + 2 * 0.002)
    assert c.step == ((2, 0.002),) and c.round_s(2, 0) == 0.002  # G = 0: the AR step's own point
    assert c.target_s(4, 3) == pytest.approx(2 * c.target_s(2, 3))  # beyond the measured rows: proportional
    assert policy.cost_model(m, None, s, 1, 4, AcceptanceRule("lantern", k=2), cache_dir=tmp_path) == c
    assert calls == [[1]]
    c = policy.cost_model(m, None, s, 8, 4, AcceptanceRule("lantern", k=2), cache_dir=tmp_path)
    assert calls == [[1], [8]]
    for rows in (2, 9, 16):  # measured and interpolated rows on the line
        assert c.target_s(rows, 3) == pytest.approx(0.01 + 0.002 * rows * 3)
        assert c.step_s(rows) == pytest.approx(0.001 * rows)
    (saved,) = tmp_path.glob("*.json")
    assert saved.name == "tiny-float64-cpu1-full-lantern2.json"
    assert set(json.loads(saved.read_text())["target"]) == {f"{r},{t}" for r in (2, 16) for t in (1, 2, 3, 4, 5)}


def test_the_engine_rounds_calibrate_the_cost_model(tmp_path, monkeypatch):
    """The engine's own rounds (an AR round, a chain of 2) are measured once per row count and kept
    in the cost file: G = 0 costs the AR round, G = 2 the chain's round, and other lengths scale the
    forwards by the same factor. The real measurement runs on the tiny model."""
    fake = lambda model, drafter, sampling, rows, tokens, rule, table: {
        "target": {f"{2 * R},{T}": 0.01 * T for R in rows for T in tokens},
        "drafter": {f"{2 * R},{T}": 0.002 for R in rows for T in (1, 2)},
    }
    monkeypatch.setattr(policy, "measure_costs", fake)
    calls = []
    engine = lambda images: calls.append(images) or (0.004, 0.02)
    m, s = tiny(), SamplingConfig(guidance=2.0)
    c = policy.cost_model(m, None, s, 1, 4, engine=engine, cache_dir=tmp_path)
    forwards = 0.03 + 0.002 + 0.002  # verify over 3 tokens, the drafter's first forward and one step
    assert c.step == ((2, 0.004),) and c.scale == ((2, pytest.approx(0.02 / forwards)),)
    assert c.round_s(2, 0) == 0.004 and c.round_s(2, 2) == pytest.approx(0.02)
    assert c.round_s(2, 4) == pytest.approx(0.02 / forwards * (0.05 + 0.002 + 3 * 0.002))
    assert policy.cost_model(m, None, s, 1, 4, engine=engine, cache_dir=tmp_path) == c and calls == [1]
    from lantern.engine.loop import _open_state, engine_rounds
    from lantern.methods.ar import AR
    from lantern.methods.chain import Chain

    d = Drafter.for_target(m, seed=3).eval()
    chain = Chain(AcceptanceRule("sd"), 2, d, None)
    ar_s, chain_s = engine_rounds(_open_state(m, chain, 1, s, m.num_tokens, None), 1, AR(), chain)
    assert ar_s > 0 and chain_s > 0


def test_decode_config_gamma_auto():
    c = DecodeConfig.of("lantern", "auto", k=2, delta=0.1, gamma_max=5)
    assert c.auto and c.draft_depth == 5 and c.as_dict()["gamma"] == "auto" and c.as_dict()["gamma_max"] == 5
    assert DecodeConfig.of("sd", 3).draft_depth == 3 and not DecodeConfig.of("sd", 3).auto
    for bad, msg in ((dict(gamma="fast"), "integer >= 1 or 'auto'"), (dict(gamma=0), "integer >= 1")):
        with pytest.raises(FieldError, match=msg):
            DecodeConfig.of("lantern", **bad)
    with pytest.raises(FieldError, match="gamma_max"):
        DecodeConfig.of("lantern", "auto", gamma_max=0)
    with pytest.raises(FieldError, match="a static tree is fixed"):
        DecodeConfig.of("lantern", "auto", tree=TreeSpec("static", ((0,), (1,), (0, 0))))
    tree = DecodeConfig.of("lantern", "auto", tree=TreeSpec("dynamic", total_tokens=5, depth=1, top_k=2))
    assert tree.auto and tree.draft_depth == 2


# --------------------------------------------------------------------------- exact enumeration
def _assert_ar_joint(run, want: dict) -> None:
    """Every outcome of ``run(draws)`` (:func:`enumerate_outcomes`), weighted by its probability, is
    the AR joint ``want`` to 1e-12, over more than 10 runs."""
    got, runs = enumerate_outcomes(run)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12) and runs > 10
    assert set(got) <= set(want)
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), seq


# acceptance rises steeply with the target's top-1 and the draft's own top-1, a drafter step
# costs half a target forward: on the tiny model the policy takes lengths 0, 1 and 2
STEEP = AcceptancePredictor((-9.0, 10.0, 0.0, 4.0), 0.5)
HALF = _flat(1.0, 0.5)


@pytest.mark.slow  # ~20 s each on 2 cores: every branch is a full decode
@pytest.mark.parametrize(
    "sampling, rule, rest, taken",
    [
        (
            SamplingConfig(guidance=2.0, temperature=0.7, top_k=3),
            AcceptanceRule("lantern", k=2, delta=0.0),
            7,
            {0, 1, 2},
        ),
        (SamplingConfig(guidance=1.0, temperature=1.0), AcceptanceRule("sd"), 0, {0, 1}),
    ],
)
def test_exact_decoding_with_the_policy_at_delta_zero_is_ar_sampling(sampling, rule, rest, taken, monkeypatch):
    """Every random outcome of an image decoded with ``gamma="auto"`` (γ_max 2, V = 4, 2 x 2
    tokens), weighted by its probability, gives exactly the AR joint: the draft length depends
    only on the past and the drafter's own proposals. The rounds take the lengths ``taken``: plain
    AR steps (with rests after them, up to ``rest`` rounds), chains stopped early and (with
    guidance) full chains; without rests the second image token can be drafted after a plain step."""
    monkeypatch.setattr(policy.GammaPolicy, "MAX_REST", rest)
    monkeypatch.setattr("lantern.methods.registry.load_predictor", lambda path, name: STEEP)
    monkeypatch.setattr(policy, "cost_model", lambda *a, **k: HALF)
    m = tiny()
    d = Drafter.for_target(m, seed=3).eval()
    nb = build_neighbourhoods(m.input_embeddings(), 2, "l2", cache=False).indices
    want = exact_joint(m, 1, sampling)
    config = DecodeConfig(rule, "auto", gamma_max=2)
    lengths = set()

    def run(draws):
        out = decode(m, [1], config, sampling, d, nb, seed=9, draws={0: draws})
        lengths.update(out.steps["drafted"].tolist())
        return tuple(out.tokens[0].tolist())

    _assert_ar_joint(run, want)
    assert lengths == taken


def test_with_speculation_off_auto_decodes_the_tokens_of_ar(monkeypatch):
    """A drafter step as dear as a target forward and a predictor that says 1/2: no draft can pay
    (:meth:`GammaPolicy.may_draft`), so every round of ``gamma="auto"`` is a plain AR step that
    draws from the image's stream as AR does (the same tokens, seed for seed, under guidance and
    top-k), and the policy's statistics are never computed after the prefill."""
    monkeypatch.setattr("lantern.methods.registry.load_predictor", lambda path, name: _always(0.5))
    monkeypatch.setattr(policy, "cost_model", lambda *a, **k: _flat(1.0, 1.0))
    calls = []
    monkeypatch.setattr("lantern.methods.chain.top1_prob", lambda p: calls.append(p.shape) or p.amax(-1))
    m, sampling = tiny(), SamplingConfig(guidance=2.0, temperature=0.9, top_k=3)
    d = Drafter.for_target(m, seed=3).eval()
    nb = build_neighbourhoods(m.input_embeddings(), 2, "l2", cache=False).indices
    conds = [1, 0, 1]
    ar = decode(m, conds, DecodeConfig.of("ar"), sampling, seed=5, batch_size=2)
    auto = decode(
        m,
        conds,
        DecodeConfig(AcceptanceRule("lantern", k=2, delta=0.1), "auto", gamma_max=2),
        sampling,
        d,
        nb,
        seed=5,
        batch_size=2,
    )
    assert np.array_equal(auto.tokens.numpy(), ar.tokens.numpy())
    assert not auto.steps["drafted"].any()
    assert calls == [(2, 4), (1, 4)]  # only for the prefills' distributions: images 0 and 1 admitted together, then 2


def test_calibration_uses_the_distribution_of_the_last_committed_token():
    """Image 0: round 1 at n = 1 drafts positions 1, 2 (the draft at 2 rejected, so x_2 came from
    p at position 2); round 2 at n = 3 drafts 3, 4: its drafts take position 2's target statistics.
    Round 2 accepts both, so x_5 is a bonus token (no draft row): round 3 at n = 6 takes position
    4's. Round 1 has no earlier token: left out."""
    rows = dict(
        image=[0, 0, 0, 0, 0],
        position=[1, 2, 3, 4, 6],
        draft_index=[0, 1, 0, 1, 0],
        p_top1=[0.1, 0.2, 0.3, 0.4, 0.5],
        p_entropy=[1.1, 1.2, 1.3, 1.4, 1.5],
        q_top1=[0.6, 0.7, 0.8, 0.9, 0.95],
        accepted=[True, False, True, True, False],
        reached=[True, True, True, True, True],
    )
    got = lagged(rows)
    assert got["p_top1"].tolist() == [0.2, 0.2, 0.4] and got["p_entropy"].tolist() == [1.2, 1.2, 1.4]
    assert got["q_top1"].tolist() == [0.8, 0.9, 0.95] and got["accepted"].tolist() == [True, True, False]
    assert got["depth"].tolist() == [1, 2, 1]


# --------------------------------------------------------------------------- Jacobi windows
def _windows(step: float, a: float, b: float) -> CostModel:
    """A Jacobi cost model at 2 model rows: AR's step ``step``, a window of L >= 2 ``a + b L``."""
    return CostModel(((2, a, b),), (), step=((2, step),), scale=((2, 1.0),))


def test_window_policy_plans_by_hand():
    """Seconds 1, 1.5, 1.75, 2 for L = 1..4. The prior (every draft passes with 1/2) expects
    1, 1.5, 1.75, 1.875 tokens: AR's step is the best (tied with 2 and 3, the first taken). After
    20 forwards in which both images' 3 drafts all passed, alpha = (S + 1) / (S + 2) at every index,
    S = 2 (1 - 0.9^20) / 0.1 = 17.57: L = 4 gives 3.70 tokens in 2 s, L = 3 2.85 in 1.75 s."""
    pol = policy.WindowPolicy(4, _windows(1.0, 1.0, 0.25))
    assert pol.seconds(2).tolist() == [1.0, 1.5, 1.75, 2.0]
    assert pol.alpha().tolist() == [0.5, 0.5, 0.5] and pol.plan(2) == 1
    pol.open_counts()
    sampled = np.ones((2, 3), dtype=bool)
    for _ in range(20):
        pol.observe(np.array([3, 3]), np.array([3, 3]), sampled)
    S = 2 * (1 - 0.9**20) / 0.1
    assert pol.alpha() == pytest.approx([(S + 1) / (S + 2)] * 3)
    assert pol.plan(2) == 4
    pol.open_counts()
    for _ in range(5):  # the first draft always rejected: the second and third never judged
        pol.observe(np.array([3, 3]), np.array([0, 0]), sampled)
    assert pol.passed.tolist() == [0.0, 0.0, 0.0] and pol.judged[1:].tolist() == [0.0, 0.0]
    assert pol.plan(2) == 1
    before = pol.judged.copy()  # new positions (an initial token each) are not counted
    pol.observe(np.array([3, 3]), np.array([0, 0]), np.array([[False, True, True], [False, False, False]]))
    assert pol.judged.tolist() == (0.9 * before).tolist()


def test_window_policy_stays_with_ar_and_switches_speculation_off():
    """Once the counts say AR's step they stay (AR's steps judge no draft), so the plan stays 1; a
    window of L tokens that costs L AR steps can never pay: speculation is off."""
    pol = policy.WindowPolicy(3, _windows(1.0, 1.0, 0.5))
    assert pol.may_speculate(2) and pol.plan(2) == 1  # the prior: 1.5 tokens for 2 s at L = 2
    assert [pol.plan(2) for _ in range(5)] == [1] * 5
    off = policy.WindowPolicy(3, _windows(1.0, 0.0, 1.0))
    assert not off.may_speculate(2) and off.plan(2) == 1


def test_jacobi_auto_with_speculation_off_decodes_the_tokens_of_ar(monkeypatch):
    """Windows that cost as many AR steps as their tokens: every forward of ``window="auto"`` is AR's
    step, drawing from the image's stream as AR does (the same tokens, seed for seed, at B = 2)."""
    monkeypatch.setattr(policy, "window_costs", lambda *a, **k: _windows(1.0, 0.0, 1.0))
    m, sampling = tiny(), SamplingConfig(guidance=1.0, temperature=2.0, top_k=3)
    conds = [1, 0, 1, 0, 1]
    ar = decode(m, conds, DecodeConfig.of("ar"), sampling, seed=5, batch_size=2)
    auto = decode(m, conds, DecodeConfig.of("sjd", window=3, auto=True), sampling, seed=5, batch_size=2)
    assert auto.tokens.tolist() == ar.tokens.tolist() and len({tuple(t) for t in ar.tokens.tolist()}) > 2
    assert auto.steps["drafted"].sum() == 0 and len(auto.drafts["image"]) == 0


@pytest.mark.slow  # ~10 s on 2 cores: every branch is a full decode
def test_exact_jacobi_decoding_with_the_window_policy_is_ar_sampling(monkeypatch):
    """Every random outcome of an SJD image decoded with ``window="auto"`` (longest 3, V = 4, 2 x 2
    tokens), weighted by its probability, is exactly the AR joint: the window follows past verdicts
    only. With the prior at 0.8 (one pseudo-count) and windows of 1, 1.5 and 1.75 AR steps, the
    policy reads 3 tokens first and after a first-draft rejection switches to AR's step: both
    occur."""
    monkeypatch.setattr(policy.WindowPolicy, "ALPHA0", 0.8)
    monkeypatch.setattr(policy.WindowPolicy, "PRIOR", 1.0)
    monkeypatch.setattr(policy, "window_costs", lambda *a, **k: _windows(1.0, 1.0, 0.25))
    m, sampling = tiny(), SamplingConfig(guidance=2.0, temperature=0.7, top_k=3)
    want = exact_joint(m, 1, sampling)
    config = DecodeConfig.of("sjd", window=3, auto=True)
    drafted = set()

    def run(draws):
        out = decode(m, [1], config, sampling, seed=9, draws={0: draws})
        drafted.update(out.steps["drafted"].tolist())
        return tuple(out.tokens[0].tolist())

    _assert_ar_joint(run, want)
    assert {0, 2} <= drafted


# --------------------------------------------------------------------------- draft trees
def _tree_costs(step: float) -> CostModel:
    """At 2 model rows: AR's step ``step``; a drafter forward 0.1 s at any width; a verify forward of
    T tokens 0.2 + 0.1 T."""
    return CostModel(((2, 0.2, 0.1),), ((2, 0.1, 0.0),), step=((2, step),), scale=((2, 1.0),))


def test_node_policy_by_hand():
    """A dynamic tree of 5 nodes, depth 1, top-k 2: drafting costs 0.1 + 1 x 0.1 = 0.2 s, verifying
    m candidates 0.3 + 0.1 m. Candidates with path probabilities 0.6, 0.3, 0.05, 0.01 expect 1.6,
    1.9, 1.95, 1.96 tokens for m = 1..4 in 0.6, 0.7, 0.8, 0.9 s: m = 2 (2.71 tokens a second). A
    tree that passes whole (3 tokens in 0.9 s) beats AR's step of 0.5 s but not one of 0.25 s;
    before any round the prior expects depth + 1 = 2 tokens in 0.9 s (the full budget): a tree
    against 0.5 s, AR's step against 0.4 s (and again: AR's steps do not move the counts)."""
    spec = TreeSpec("dynamic", total_tokens=5, depth=1, top_k=2)
    pol = policy.NodePolicy(spec, _tree_costs(0.5))
    assert pol.drafting_s(2) == pytest.approx(0.2) and pol.verify_s(2, 4) == pytest.approx(0.7)
    score = torch.log(torch.tensor([[0.05, 0.6, 0.01, 0.3, 0.0]], dtype=torch.float64))
    assert pol.budget(score, 4, 2) == 2 and pol.last == 2
    assert pol.may_draft(2) and not policy.NodePolicy(spec, _tree_costs(0.25)).may_draft(2)
    pol.open_counts()
    assert pol.tau() == 2.0 and pol.plan(2)
    slow = policy.NodePolicy(spec, _tree_costs(0.4))
    assert [slow.plan(2) for _ in range(3)] == [False] * 3
    pol.observe(np.array([1, 3]))  # one image committed 1 token, the other 3
    assert pol.tau() == pytest.approx((4 + 2 * 2) / (2 + 2))


def test_tree_auto_with_speculation_off_decodes_the_tokens_of_ar(monkeypatch):
    """AR's step at 0.25 s beats a tree that passes whole: every round of a dynamic tree with
    ``gamma="auto"`` is AR's step, with AR's tokens seed for seed."""
    monkeypatch.setattr(policy, "cost_model", lambda *a, **k: _tree_costs(0.25))
    m, sampling = tiny(), SamplingConfig(guidance=1.0, temperature=2.0, top_k=3)
    d = Drafter.for_target(m, seed=3).eval()
    conds = [1, 0, 1, 0, 1]
    ar = decode(m, conds, DecodeConfig.of("ar"), sampling, seed=5, batch_size=2)
    tree = TreeSpec("dynamic", total_tokens=5, depth=1, top_k=2)
    auto = decode(m, conds, DecodeConfig(AcceptanceRule("sd"), "auto", tree=tree), sampling, d, seed=5, batch_size=2)
    assert auto.tokens.tolist() == ar.tokens.tolist()
    assert auto.steps["drafted"].sum() == 0


@pytest.mark.slow  # ~20 s on 2 cores: every branch is a full decode
def test_exact_tree_decoding_with_the_node_policy_at_delta_zero_is_ar_sampling(monkeypatch):
    """Every random outcome of an image decoded with a dynamic tree and ``gamma="auto"`` (5 nodes,
    depth 1, top-k 2, V = 4, 2 x 2 tokens), weighted by its probability, is exactly the AR joint:
    whether a round drafts follows past rounds only and the budget the drafter's own scores. AR's
    steps and trees of several budgets both occur."""
    monkeypatch.setattr(policy, "cost_model", lambda *a, **k: _tree_costs(0.5))
    monkeypatch.setattr(policy.NodePolicy, "PRIOR", 1.0)
    m, sampling = tiny(), SamplingConfig(guidance=2.0, temperature=0.7, top_k=3)
    d = Drafter.for_target(m, seed=3).eval()
    nb = build_neighbourhoods(m.input_embeddings(), 2, "l2", cache=False).indices
    want = exact_joint(m, 1, sampling)
    tree = TreeSpec("dynamic", total_tokens=5, depth=1, top_k=2)
    config = DecodeConfig(AcceptanceRule("lantern", k=2, delta=0.0), "auto", tree=tree)
    drafted = set()

    def run(draws):
        out = decode(m, [1], config, sampling, d, nb, seed=9, draws={0: draws})
        drafted.update(out.steps["drafted"].tolist())
        return tuple(out.tokens[0].tolist())

    _assert_ar_joint(run, want)
    assert 0 in drafted and len(drafted) >= 3, drafted
