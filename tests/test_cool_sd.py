"""Cool-SD (lantern/rules/cool_sd.py; the "cool-sd" entry of lantern.rules.acceptance.RELAXATIONS).

* the annealed schedule ω by hand (its mean over a chain is δ; ν = 0 is uniform);
* judge / residual / output_distribution on hand-computed cases: accept iff ``u q < ω p``, the
  TV-optimal residual ``norm(max(p - min(q, ω p), 0))``, the exact per-step output and its TVD
  (ω >= 1: ``Σ max(min(q, ω p) - p, 0)``; ω <= 1 is lossless), checked against exact enumeration
  over every draft;
* greedy: ``max(ω, 1) p(x̂)`` against the best other token;
* the decoder: each row's own chain length and places reach the rule; end to end through
  ``lantern.engine.decode.decode`` batch 1 equals batch 3 in float64; δ = 1, ν = 0 is "sd" token
  for token;
* bad knobs and uses raise one-line UsageErrors.
"""

import math

import pytest
import torch
from test_engine import _same_records
from test_trees import TREES, enumerate_outcomes, exact_joint, tiny

from ambiguity.errors import UsageError
from ambiguity.sampling import SamplingConfig
from lantern.distortion import chain_place_tvds
from lantern.drafter.model import Drafter
from lantern.engine.decode import DecodeConfig, decode
from lantern.engine.records import Decoded
from lantern.methods.chain import accept
from lantern.rules.acceptance import AcceptanceRule, judge, judge_greedy, residual
from lantern.rules.cool_sd import annealed_weights
from lantern.rules.divergences import tvd
from lantern.rules.output import output_distribution

F64 = torch.float64
P = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
Q = torch.tensor([0.2, 0.2, 0.6], dtype=F64)


def t(x):
    return torch.tensor(x, dtype=F64)


# ----------------------------------------------------------------------------- schedule
def test_schedule_by_hand():
    # ν = ln 2: weights ∝ 1, 1/2 over a chain of 2, mean δ -> δ (4/3, 2/3)
    w = annealed_weights(torch.arange(2), torch.tensor(2), 1.5, math.log(2.0))
    assert torch.allclose(w, t([2.0, 1.0]), atol=1e-15)
    # ν = 0.7, L = 3: δ 3 e^{-0.7 i} / (1 + e^{-0.7} + e^{-1.4})
    s = 1 + math.exp(-0.7) + math.exp(-1.4)
    w = annealed_weights(torch.arange(3), torch.tensor(3), 1.1, 0.7)
    assert torch.allclose(w, t([1.1 * 3 * math.exp(-0.7 * i) / s for i in range(3)]), atol=1e-15)
    assert w.mean().item() == pytest.approx(1.1, abs=1e-15) and bool((w[1:] < w[:-1]).all())
    # a chain of one draft, and ν = 0: ω = δ
    assert annealed_weights(torch.tensor([0]), torch.tensor([1]), 2.0, 0.7).tolist() == [2.0]
    assert annealed_weights(torch.arange(4), torch.tensor(4), 1.3, 0.0).tolist() == [1.3] * 4
    # per-row lengths broadcast: (B, γ) places against (B, 1) lengths
    w = annealed_weights(torch.arange(3).expand(2, 3), torch.tensor([[3], [2]]), 2.0, 0.7)
    assert torch.allclose(w[0], annealed_weights(torch.arange(3), torch.tensor(3), 2.0, 0.7))
    assert torch.allclose(w[1, :2], annealed_weights(torch.arange(2), torch.tensor(2), 2.0, 0.7))


# ----------------------------------------------------------------------------- one step
def test_judge_accepts_iff_u_q_below_omega_p():
    rule = AcceptanceRule("cool-sd", cool_delta=2.0, cool_nu=0.0)  # ω = 2 everywhere
    # draft 1: p = 0.3, q = 0.2 -> ω p / q = 3 -> always; draft 2: p = 0.2, q = 0.6 -> 2/3
    drafts = torch.tensor([1, 2])
    v = judge(P.expand(2, 3), Q.expand(2, 3), drafts, t([0.99, 0.66]), None, rule)
    assert v.accepted.tolist() == [True, True]
    assert torch.allclose(v.accept_prob, t([1.0, 2 / 3]), atol=1e-15)
    assert torch.allclose(v.p_tilde, t([0.6, 0.4]), atol=1e-15) and v.spent.tolist() == [2.0, 2.0]
    assert v.j_star.tolist() == [0, 0]
    assert (
        judge(P, Q, torch.tensor(2), t(0.67), None, rule, positions=torch.tensor(0), lengths=1).accepted.item() is False
    )


def test_judge_reads_each_place_of_the_chain():
    rule = AcceptanceRule("cool-sd", cool_delta=1.5, cool_nu=math.log(2.0))  # ω = (2, 1) on a chain of 2
    p, q = P.expand(2, 3), Q.expand(2, 3)
    v = judge(p, q, torch.tensor([2, 2]), t([0.0, 0.0]), None, rule)  # default: the last dim is the chain
    assert torch.allclose(v.spent, t([2.0, 1.0])) and torch.allclose(v.accept_prob, t([2 / 3, 1 / 3]))
    v = judge(
        p,
        q,
        torch.tensor([2, 2]),
        t([0.0, 0.0]),
        None,
        rule,
        positions=torch.tensor([1, 0]),
        lengths=torch.tensor([2, 1]),
    )
    assert torch.allclose(v.spent, t([1.0, 1.5]))


def test_residual_by_hand():
    rule = AcceptanceRule("cool-sd")
    # ω = 1/2: min(q, p/2) = (0.2, 0.15, 0.1) -> p - that = (0.3, 0.15, 0.1) / 0.55
    r = residual(P, Q, torch.tensor(2), None, AcceptanceRule("cool-sd", cool_nu=0.0), positions=0, lengths=1)
    assert torch.allclose(r, t([0.3, 0.1, 0.0]) / 0.4, atol=1e-15)  # ω = 1.1 >= 1: the standard residual
    half = _rule_with_omega(0.5)
    r = residual(P, Q, torch.tensor(2), None, half[0], positions=half[1], lengths=half[2])
    assert torch.allclose(r, t([0.3, 0.15, 0.1]) / 0.55, atol=1e-15)
    with pytest.raises(UsageError, match="pass positions and lengths"):
        residual(P, Q, torch.tensor(2), None, rule)


def _rule_with_omega(omega):
    """A rule, place and chain length whose factor is ``omega`` (< δ): the last place of a chain of
    2 with ν = ln(2δ/ω - 1), δ = 1 -> weights 2/(1+r), 2r/(1+r) with r = e^{-ν}."""
    r = omega / (2.0 - omega)
    rule = AcceptanceRule("cool-sd", cool_delta=1.0, cool_nu=-math.log(r))
    assert annealed_weights(torch.tensor(1), torch.tensor(2), 1.0, rule.cool_nu).item() == pytest.approx(omega)
    return rule, 1, 2


def test_output_distribution_by_hand_and_its_tvd():
    two = AcceptanceRule("cool-sd", cool_delta=2.0, cool_nu=0.0)
    # ω = 2: α = min(q, 2p) = (0.2, 0.2, 0.4); rejected mass 0.2 to norm((p - q)+) = (0.75, 0.25, 0)
    out = output_distribution(P, Q, None, two, positions=0, lengths=1)
    assert torch.allclose(out, t([0.35, 0.25, 0.4]), atol=1e-15)
    assert tvd(out, P).item() == pytest.approx(0.2, abs=1e-15)  # Σ max(α - p, 0) = 0.4 - 0.2
    # ω <= 1: accepting less than SD with the residual G* is lossless
    rule, i, L = _rule_with_omega(0.5)
    assert torch.allclose(output_distribution(P, Q, None, rule, positions=i, lengths=L), P, atol=1e-15)
    # δ = 1, ν = 0 is SD
    one = AcceptanceRule("cool-sd", cool_delta=1.0, cool_nu=0.0)
    assert torch.allclose(output_distribution(P, Q, None, one, positions=0, lengths=3), P, atol=1e-15)


def test_tvd_at_each_place_of_a_chain():
    rule = AcceptanceRule("cool-sd", cool_delta=1.5, cool_nu=math.log(2.0))  # ω = (2, 1) on a chain of 2
    assert torch.allclose(chain_place_tvds(P, Q, rule, 2), t([0.2, 0.0]), atol=1e-15)
    batch = chain_place_tvds(torch.stack([P, Q]), torch.stack([Q, Q]), rule, 2)
    assert batch.shape == (2, 2) and torch.allclose(batch[:, 0], t([0.2, 0.0]), atol=1e-15)
    with pytest.raises(UsageError, match="gamma must be an integer >= 1"):
        chain_place_tvds(P, Q, rule, 0)


@pytest.mark.parametrize("omega", [0.4, 0.9, 1.0, 1.7, 3.0])
def test_output_distribution_equals_enumeration_over_drafts(omega):
    """Σ_x q(x) [accept x] e_x + q(x) (1 - accept) residual, from judge and residual for every x."""
    gen = torch.Generator().manual_seed(0)
    for V, zeros in ((3, 0), (5, 1), (7, 2)):
        p = torch.rand(V, generator=gen, dtype=F64) ** 2
        p[:zeros] = 0
        p /= p.sum()
        q = torch.rand(V, generator=gen, dtype=F64)
        q /= q.sum()
        if omega < 1:
            rule, i, L = _rule_with_omega(omega)
        else:
            rule, i, L = AcceptanceRule("cool-sd", cool_delta=omega, cool_nu=0.0), 0, 2
        out = torch.zeros(V, dtype=F64)
        for x in range(V):
            pos = torch.tensor(i)
            a = judge(p, q, torch.tensor(x), t(0.0), None, rule, positions=pos, lengths=L).accept_prob
            assert a.item() == pytest.approx(min(1.0, omega * p[x].item() / q[x].item()), rel=1e-12)
            out[x] += q[x] * a
            out += q[x] * (1 - a) * residual(p, q, torch.tensor(x), None, rule, positions=pos, lengths=L)
        got = output_distribution(p, q, None, rule, positions=i, lengths=L)
        assert torch.allclose(got, out, atol=1e-14, rtol=0)
        alpha = torch.minimum(q, omega * p)
        want_tvd = (alpha - p).clamp_min(0).sum() if omega >= 1 else t(0.0)
        assert tvd(got, p).item() == pytest.approx(want_tvd.item(), abs=1e-14)


def test_greedy_never_rejects_the_argmax():
    rule, i, L = _rule_with_omega(0.5)
    p = t([0.4, 0.35, 0.25])
    # argmax 0 with ω = 1/2: 0.2 < 0.35, but greedy uses max(ω, 1) -> accepted
    assert judge_greedy(p, torch.tensor(0), None, rule, positions=torch.tensor(i), lengths=L).accepted.item()
    two = AcceptanceRule("cool-sd", cool_delta=2.0, cool_nu=0.0)
    g = judge_greedy(
        p.expand(3, 3), torch.tensor([0, 1, 2]), None, two, positions=torch.zeros(3, dtype=torch.long), lengths=1
    )
    assert g.accepted.tolist() == [True, True, True]  # 2 * 0.25 = 0.5 >= 0.4
    g = judge_greedy(
        t([0.6, 0.25, 0.15]).expand(3, 3),
        torch.tensor([0, 1, 2]),
        None,
        two,
        positions=torch.zeros(3, dtype=torch.long),
        lengths=1,
    )
    assert g.accepted.tolist() == [True, False, False]
    # greedy output on P = (0.5, 0.3, 0.2): 2 * 0.3 >= 0.5 keeps draft 1, 2 * 0.2 < 0.5 rejects draft 2 to argmax 0
    q = t([0.1, 0.3, 0.6])
    out = output_distribution(P, q, None, two, greedy=True, positions=0, lengths=1)
    assert torch.allclose(out, t([0.7, 0.3, 0.0]), atol=1e-15)


# ----------------------------------------------------------------------------- the decoder
def test_accept_gives_each_row_its_own_schedule():
    """Rows with chains of 3 and 1 (the image's end): ω of row 0 is the 3-chain's, row 1's is δ."""
    rule = AcceptanceRule("cool-sd", cool_delta=2.0, cool_nu=0.7)
    V = 3
    p = P.expand(2, 4, V).clone()
    q = Q.expand(2, 3, V).clone()
    drafts = torch.tensor([[2, 2, 2], [2, 0, 0]])
    u = torch.zeros(2, 3, dtype=F64)
    res = accept(p, q, drafts, rule, None, False, lengths=torch.tensor([3, 1]), u=u, choose=lambda pr: pr.argmax(-1))
    w3 = annealed_weights(torch.arange(3), torch.tensor(3), 2.0, 0.7)
    assert torch.allclose(res.verdict.spent[0], w3) and res.verdict.spent[1, 0].item() == pytest.approx(2.0)
    assert res.accepted.tolist() == [3, 1]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny(vocab=32, block=16, dim=32, std=0.5)


@pytest.fixture(scope="module")
def drafter(model):
    return Drafter.for_target(model, seed=2).eval()


SAMPLINGS = [
    SamplingConfig(guidance=2.0, temperature=1.0),
    SamplingConfig(guidance=3.0, temperature=0.8, top_k=12),
    SamplingConfig(guidance=2.0, temperature=0.0),
]


@pytest.mark.parametrize("config", [DecodeConfig.of("cool-sd", 3, cool_delta=2.0), DecodeConfig.of("cool-sd", 4)])
def test_float64_batch_three_equals_batch_one(model, drafter, config):
    labels = [0, 3, 5, 7, 1]
    for s in SAMPLINGS:
        one = Decoded.concat(
            [decode(model, [c], config, s, drafter, seed=11, first_index=5 + i) for i, c in enumerate(labels)]
        )
        many = decode(model, labels, config, s, drafter, seed=11, first_index=5, batch_size=3)
        assert torch.equal(one.tokens, many.tokens), s
        _same_records(one, many)
        drafts = many.drafts
        assert set(drafts["j_star"]) == {0}  # no neighbourhood; spent records ω
        assert (drafts["spent"] > 0).all()


def test_uniform_unit_factor_is_sd_token_for_token(model, drafter):
    s = SamplingConfig(guidance=2.0, temperature=1.0, top_k=16)
    sd = decode(model, [1, 2, 3], DecodeConfig.of("sd", 3), s, drafter, seed=3, batch_size=2)
    cool = decode(
        model, [1, 2, 3], DecodeConfig.of("cool-sd", 3, cool_delta=1.0, cool_nu=0.0), s, drafter, seed=3, batch_size=2
    )
    assert torch.equal(sd.tokens, cool.tokens)
    assert (sd.steps["accepted"] == cool.steps["accepted"]).all()


def test_more_relaxation_accepts_more(model, drafter):
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    labels = list(range(6))
    tau = [
        decode(model, labels, DecodeConfig.of(m, 4, **kw), s, drafter, seed=5, batch_size=3).summary()["tau"]
        for m, kw in (("sd", {}), ("cool-sd", dict(cool_delta=3.0)))
    ]
    assert tau[1] > tau[0]


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(cool_delta=0.9), "AcceptanceRule.cool_delta must be >= 1"),
        (dict(cool_delta=float("inf")), "AcceptanceRule.cool_delta must be >= 1"),
        (dict(cool_nu=-0.1), "AcceptanceRule.cool_nu must be >= 0"),
        (dict(cool_nu=float("nan")), "AcceptanceRule.cool_nu must be >= 0"),
        (dict(convention="official"), "has only 'exact'"),
    ],
)
def test_bad_knobs_raise_usage_errors(kwargs, needle):
    with pytest.raises(UsageError, match=needle) as err:
        AcceptanceRule("cool-sd", **kwargs)
    assert "\n" not in str(err.value)


def test_trees_refuse_cool_sd(model, drafter):
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    with pytest.raises(UsageError, match="has no draft tree"):
        decode(model, [0], DecodeConfig.of("cool-sd", tree=TREES["dynamic"]), s, drafter, seed=0)


def test_records_name_the_knobs_of_their_own_rule_only():
    """Runs of the other rules keep their settings record (resume across the upgrade)."""
    assert AcceptanceRule("lantern").as_dict() == dict(method="lantern", k=64, delta=0.2, lam=2.0, convention="exact")
    cool = AcceptanceRule("cool-sd", cool_delta=2.0).as_dict()
    assert cool["cool_delta"] == 2.0 and cool["cool_nu"] == 0.7 and "fly_window" not in cool
    assert DecodeConfig.of("fly", 5, fly_window=3).as_dict()["fly_window"] == 3


# ----------------------------------------------------------------------------- exact enumeration
def _enumerated_joint(rule, sampling, image=0):
    """{tokens: probability} of one image of a real batched decode (V = 4, 2 x 2 tokens, γ = 2, 3
    images in 2 slots), every coin and categorical draw branched with its probability; and the AR joint."""
    m = tiny()
    d = Drafter.for_target(m, seed=3).eval()

    def run(draws):
        out = decode(m, [1, 2, 1], DecodeConfig(rule, 2), sampling, d, seed=9, batch_size=2, draws={image: draws})
        return tuple(out.tokens[image].tolist())

    got, runs = enumerate_outcomes(run)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12) and runs > 10
    return got, exact_joint(m, 1, sampling)


@pytest.mark.slow  # ~1 min each: every branch is a full batched decode of 3 images
def test_exact_decoding_with_unit_factor_is_ar_sampling():
    got, want = _enumerated_joint(
        AcceptanceRule("cool-sd", cool_delta=1.0, cool_nu=0.0), SamplingConfig(guidance=2.0, temperature=0.7, top_k=3)
    )
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), seq


@pytest.mark.slow
def test_relaxed_decoding_is_not_ar_sampling():
    """Power check: δ = 3 moves the joint away from AR."""
    got, want = _enumerated_joint(
        AcceptanceRule("cool-sd", cool_delta=3.0), SamplingConfig(guidance=1.0, temperature=1.0)
    )
    assert max(abs(got.get(k, 0.0) - v) for k, v in want.items()) > 1e-3
