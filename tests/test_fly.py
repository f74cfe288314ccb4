"""FLy (lantern/rules/fly.py; the "fly" entry of lantern.rules.acceptance.RELAXATIONS).

* the top-3 entropy gate by hand;
* the deferral walk on hand patterns, and on every native verdict pattern of chains up to 6
  against a direct loop over the rule's three conditions;
* the exact per-step output distribution on hand cases (``out = p + π (q - p)`` with the gate
  open, p itself with the gate shut) and against exact enumeration of a whole chain through the
  real ``accept`` (every draft sequence and verdict pattern of a context-free toy, each with its
  probability): the first emitted token's distribution is ``output_distribution`` with
  ``window_pass = β^W``;
* greedy deferral; the decoder end to end (batch 3 = batch 1 in float64; a shut gate is "sd"
  token for token; deferrals raise τ); bad knobs and uses raise one-line UsageErrors.
"""

import itertools
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
from lantern.rules.acceptance import AcceptanceRule, judge_greedy, walk
from lantern.rules.divergences import tvd
from lantern.rules.fly import deferred, top_entropy
from lantern.rules.output import output_distribution

F64 = torch.float64
P = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
Q = torch.tensor([0.2, 0.2, 0.6], dtype=F64)


def t(x):
    return torch.tensor(x, dtype=F64)


def b(bits: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in bits]])


# ----------------------------------------------------------------------------- gate and walk
def test_top_entropy_by_hand():
    # 0.5, 0.25, 0.25: 0.5 ln 2 + 0.5 ln 4 = 1.5 ln 2
    assert top_entropy(t([0.25, 0.5, 0.0, 0.25])).item() == pytest.approx(1.5 * math.log(2), abs=1e-15)
    # only the three largest count, not renormalised: 0.7, 0.1, 0.1 of (0.7, 0.1, 0.1, 0.05, 0.05)
    want = -(0.7 * math.log(0.7) + 0.2 * math.log(0.1))
    assert top_entropy(t([0.05, 0.1, 0.7, 0.1, 0.05])).item() == pytest.approx(want, abs=1e-15)
    assert top_entropy(t([1.0, 0.0, 0.0])).item() == 0.0
    assert top_entropy(t([0.5, 0.5])).item() == pytest.approx(math.log(2), abs=1e-15)  # V < 3: all of it


@pytest.mark.parametrize(
    "native, window, want",
    [
        ("0110", 2, "1110"),  # the two drafts after draft 0 agree: deferred
        ("0100", 2, "0100"),  # only one of two agrees
        ("01011", 2, "01111"),  # draft 2 deferred; the prefix still stops at draft 0
        ("011011", 2, "111111"),  # two deferrals, W + 1 apart
        ("101", 2, "101"),  # the window of draft 1 runs past the chain: nothing deferred
        ("0111", 3, "1111"),
        ("0011", 1, "0111"),  # draft 0's window is draft 1, itself rejected (windows read native verdicts)
    ],
)
def test_deferred_hand_patterns(native, window, want):
    n = b(native)
    out = deferred(n, torch.ones(n.shape, dtype=F64), torch.ones(n.shape, dtype=F64), 0.3, window)
    assert out.tolist() == b(want).tolist()


def test_deferred_needs_the_gate_and_a_possible_draft():
    n = b("0110")
    ones = torch.ones(1, 4, dtype=F64)
    low = t([[0.29, 1.0, 1.0, 1.0]])
    assert deferred(n, low, ones, 0.3, 2).tolist() == n.tolist()  # target confident: no deferral
    assert deferred(n, t([[0.3, 1.0, 1.0, 1.0]]), ones, 0.3, 2)[0, 0].item()  # at θ: deferred
    no_mass = t([[0.0, 1.0, 1.0, 1.0]])
    assert deferred(n, ones, no_mass, 0.3, 2).tolist() == n.tolist()  # p(x̂) = 0: never


def _loop_deferred(native, window):
    g = len(native)
    out = list(native)
    for i in range(g):
        if not native[i] and i + window < g and all(native[i + 1 : i + 1 + window]):
            out[i] = True
    return out


def test_deferred_equals_a_loop_on_every_pattern():
    for g in range(1, 7):
        pats = torch.tensor(list(itertools.product([False, True], repeat=g)))  # (2^g, g): a batch of chains
        ones = torch.ones(pats.shape, dtype=F64)
        for window in range(1, g + 1):
            got = deferred(pats, ones, ones, 0.0, window)
            for row, pat in zip(got.tolist(), pats.tolist()):
                assert row == _loop_deferred(pat, window), (pat, window)


# ----------------------------------------------------------------------------- one step
def test_output_distribution_by_hand():
    rule = AcceptanceRule("fly", fly_entropy=0.0)
    # gate open, q << p: out = p + π (q - p), TVD = π TVD(p, q) = 0.5 * 0.4
    out = output_distribution(P, Q, None, rule, window_pass=0.5)
    assert torch.allclose(out, t([0.35, 0.25, 0.4]), atol=1e-15)
    assert tvd(out, P).item() == pytest.approx(0.2, abs=1e-15)
    assert torch.allclose(output_distribution(P, Q, None, rule, window_pass=1.0), Q, atol=1e-15)
    assert torch.allclose(output_distribution(P, Q, None, rule, window_pass=0.0), P, atol=1e-15)
    # gate shut (H_3(P) = 1.03 nats < 2): lossless
    shut = AcceptanceRule("fly", fly_entropy=2.0)
    assert torch.allclose(output_distribution(P, Q, None, shut, window_pass=1.0), P, atol=1e-15)
    # a draft the target cannot emit is never deferred: p = (0.6, 0.4, 0), q = (0.2, 0.2, 0.6)
    p0 = t([0.6, 0.4, 0.0])
    assert torch.allclose(output_distribution(p0, Q, None, rule, window_pass=1.0), p0, atol=1e-15)


def test_tvd_at_each_place_of_a_chain():
    rule = AcceptanceRule("fly", fly_entropy=0.0, fly_window=1)
    # places 0 and 1 have a window inside a chain of 3: π TVD(p, q) = 0.5 * 0.4; place 2 defers nothing
    assert torch.allclose(chain_place_tvds(P, Q, rule, 3, window_pass=0.5), t([0.2, 0.2, 0.0]), atol=1e-15)
    with pytest.raises(UsageError, match="pass window_pass"):
        chain_place_tvds(P, Q, rule, 3)


def test_greedy_output_by_hand():
    rule = AcceptanceRule("fly", fly_entropy=0.0)
    q = t([0.1, 0.3, 0.6])  # greedy drafts: 0 (the argmax) kept; 1 and 2 deferred with probability π
    out = output_distribution(P, q, None, rule, greedy=True, window_pass=0.25)
    assert torch.allclose(out, t([0.1 + 0.9 * 0.75, 0.3 * 0.25, 0.6 * 0.25]), atol=1e-15)


def test_first_token_of_a_whole_chain_equals_output_distribution():
    """A context-free toy (the same p and q at every place): enumerate every draft sequence (q-weighted)
    and every native verdict pattern (each verdict with its probability, realised by its coin u)
    through the real ``accept``; the first emitted token is the draft 0 if it is kept, else a draw
    from the residual. Its distribution equals output_distribution with window_pass = β^W."""
    V, g = 3, 3
    p, q = t([0.5, 0.3, 0.2]), t([0.25, 0.15, 0.6])
    for window, theta in ((1, 0.0), (2, 0.0), (2, 5.0)):
        rule = AcceptanceRule("fly", fly_entropy=theta, fly_window=window)
        drafts = torch.tensor(list(itertools.product(range(V), repeat=g)))  # (V^g, g)
        pats = torch.tensor(list(itertools.product([False, True], repeat=g)))  # (2^g, g)
        D = drafts.repeat_interleave(len(pats), 0)
        A = pats.repeat(len(drafts), 1)
        a = (p[D] / q[D]).clamp(max=1.0)  # native acceptance probability of each draft
        weight = q[D].prod(-1) * torch.where(A, a, 1 - a).prod(-1)  # P(drafts) P(pattern | drafts)
        u = torch.where(A, torch.zeros_like(a), (a + 1) / 2)  # a coin that realises the pattern
        seen = []
        res = accept(
            p.expand(len(D), g + 1, V),
            q.expand(len(D), g, V),
            D,
            rule,
            None,
            False,
            u=u,
            choose=lambda probs, seen=seen: seen.append(probs) or torch.zeros(len(probs), dtype=torch.long),
        )
        assert (res.verdict.accepted | ~A).all()  # native acceptances stay accepted
        # draft 0 kept, else the next token's distribution handed to choose (the residual at place 0)
        first = torch.where((res.accepted > 0)[:, None], torch.eye(V, dtype=F64)[D[:, 0]], seen[0])
        got = (weight[:, None] * first).sum(0)
        beta = torch.minimum(p, q).sum()
        want = output_distribution(p, q, None, rule, window_pass=beta**window)
        assert torch.allclose(got, want, atol=1e-14), (window, theta)


def test_greedy_walk_defers_a_near_tie():
    """Greedy: draft 0 is not the argmax of a flat target (entropy high); drafts 1, 2 are argmaxes."""
    rule = AcceptanceRule("fly", fly_entropy=0.5, fly_window=2)
    p = torch.stack([t([0.4, 0.35, 0.25]), t([0.1, 0.8, 0.1]), t([0.05, 0.05, 0.9]), t([1 / 3] * 3)])[None]
    drafts = torch.tensor([[1, 1, 2]])
    res = accept(p, None, drafts, rule, None, True)
    assert res.accepted.tolist() == [3] and res.next_kind.tolist() == [1]
    v = judge_greedy(p[:, :3], drafts, None, rule)
    assert v.accepted.tolist() == [[False, True, True]]
    assert walk(v.accepted, v, rule).tolist() == [[True, True, True]]
    assert v.spent[0, 0].item() == pytest.approx(top_entropy(p[0, 0]).item())
    sure = AcceptanceRule("fly", fly_entropy=1.2, fly_window=2)  # H_3 = 1.08 nats < 1.2: no deferral
    res = accept(p, None, drafts, sure, None, True)
    assert res.accepted.tolist() == [0] and res.next_token.tolist() == [0]


# ----------------------------------------------------------------------------- the decoder
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


@pytest.mark.parametrize(
    "config", [DecodeConfig.of("fly", 4, fly_window=1, fly_entropy=0.0), DecodeConfig.of("fly", 5, fly_window=2)]
)
def test_float64_batch_three_equals_batch_one(model, drafter, config):
    labels = [0, 3, 5, 7, 1]
    for s in SAMPLINGS:
        one = Decoded.concat(
            [decode(model, [c], config, s, drafter, seed=11, first_index=5 + i) for i, c in enumerate(labels)]
        )
        many = decode(model, labels, config, s, drafter, seed=11, first_index=5, batch_size=3)
        assert torch.equal(one.tokens, many.tokens), s
        _same_records(one, many)
        assert set(many.drafts["j_star"]) == {0}  # no neighbourhood; spent records the top-3 entropy
        assert (many.drafts["spent"] >= 0).all() and (many.drafts["spent"] <= 3 / math.e + 1e-12).all()


def test_deferrals_raise_tau_and_a_shut_gate_is_sd(model, drafter):
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    labels = list(range(6))
    runs = {
        name: decode(model, labels, DecodeConfig.of(m, 4, **kw), s, drafter, seed=5, batch_size=3)
        for name, m, kw in (
            ("sd", "sd", {}),
            ("shut", "fly", dict(fly_entropy=100.0)),
            ("open", "fly", dict(fly_entropy=0.0, fly_window=1)),
        )
    }
    assert torch.equal(runs["sd"].tokens, runs["shut"].tokens)
    assert runs["open"].summary()["tau"] > runs["sd"].summary()["tau"]
    # a deferred draft is recorded accepted although its coin failed: u >= accept_prob
    d = runs["open"].drafts
    assert ((d["accepted"]) & (d["u"] >= d["accept_prob"])).any()


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(fly_entropy=-0.1), "AcceptanceRule.fly_entropy must be >= 0"),
        (dict(fly_entropy=float("nan")), "AcceptanceRule.fly_entropy must be >= 0"),
        (dict(fly_window=0), "AcceptanceRule.fly_window must be an integer >= 1"),
        (dict(fly_window=1.5), "AcceptanceRule.fly_window must be an integer >= 1"),
        (dict(fly_window=True), "AcceptanceRule.fly_window must be an integer >= 1"),
        (dict(convention="official"), "has only 'exact'"),
    ],
)
def test_bad_knobs_raise_usage_errors(kwargs, needle):
    with pytest.raises(UsageError, match=needle) as err:
        AcceptanceRule("fly", **kwargs)
    assert "\n" not in str(err.value)


def test_bad_uses_raise_usage_errors(model, drafter):
    rule = AcceptanceRule("fly")
    with pytest.raises(UsageError, match="pass window_pass"):
        output_distribution(P, Q, None, rule)
    with pytest.raises(UsageError, match="window_pass must be a probability"):
        output_distribution(P, Q, None, rule, window_pass=1.5)
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    with pytest.raises(UsageError, match="has no draft tree"):
        decode(model, [0], DecodeConfig.of("fly", tree=TREES["static"]), s, drafter, seed=0)


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
@pytest.mark.parametrize(
    "rule",
    [AcceptanceRule("fly", fly_entropy=100.0, fly_window=1)],
)
def test_exact_decoding_without_deferrals_is_ar_sampling(rule):
    """A shut gate: FLy is SD, lossless. (A window as long as the chain, which defers nothing either,
    is refused by DecodeConfig: ``test_a_window_not_shorter_than_the_chain_is_refused``.)"""
    got, want = _enumerated_joint(rule, SamplingConfig(guidance=2.0, temperature=0.7, top_k=3))
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), seq


def test_a_window_not_shorter_than_the_chain_is_refused():
    """vLLM requires W < γ: a window of the chain's length or more defers nothing, so it is refused."""
    with pytest.raises(UsageError, match=r"--fly-window 2 must be < --gamma 2 .*; use --fly-window 1$"):
        DecodeConfig.of("fly", 2, fly_window=2)
    with pytest.raises(UsageError, match="needs --gamma >= 2"):
        DecodeConfig.of("fly", 1, fly_window=1)
    assert DecodeConfig.of("fly").rule.fly_window == 3  # vLLM's min(6, γ - 1) at the default γ = 4


@pytest.mark.slow
def test_deferring_decoding_is_not_ar_sampling():
    """Power check: θ = 0 and W = 1 defer the first draft of a chain whenever the second agrees."""
    got, want = _enumerated_joint(
        AcceptanceRule("fly", fly_entropy=0.0, fly_window=1), SamplingConfig(guidance=1.0, temperature=1.0)
    )
    assert max(abs(got.get(k, 0.0) - v) for k, v in want.items()) > 1e-3
