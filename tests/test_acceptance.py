"""Acceptance rules (lantern/rules/acceptance.py) checked exactly: hand-computed verdicts, exact
enumeration of all draft outcomes against a loop-based reference, closed forms, bounds.

Probabilities in the hand cases are dyadic (multiples of 1/16) so float sums are exact and
the ``<=`` comparisons at the bounds are decided exactly.
"""

import math

import pytest
import torch

from ambiguity.errors import UsageError
from lantern.rules.acceptance import (
    BOUNDS,
    RELAXATIONS,
    AcceptanceRule,
    judge,
    judge_greedy,
    relaxed_mass,
    residual,
    walk,
)
from lantern.rules.divergences import jsd, moved_jsd, tvd
from lantern.rules.output import output_distribution, output_distributions

F64 = torch.float64

# V = 8 hand case. p sums to 1 exactly.
P8 = [4 / 16, 2 / 16, 1 / 16, 1 / 16, 2 / 16, 4 / 16, 1 / 16, 1 / 16]
# Row v = latent neighbours of v, nearest first, v excluded (4 columns).
NB8 = [
    [2, 3, 1, 4],
    [0, 4, 5, 2],
    [3, 0, 1, 6],
    [2, 7, 6, 0],
    [1, 5, 0, 7],
    [4, 6, 7, 1],
    [7, 3, 5, 2],
    [6, 3, 0, 4],
]


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def nb(rows):
    return torch.tensor(rows, dtype=torch.long)


# ----------------------------------------------------------------------------- reference
def ref_jsd(p, r):
    """JSD in nats by the definition, in plain Python."""
    total = 0.0
    for a, b in zip(p, r):
        m = 0.5 * (a + b)
        if a > 0:
            total += 0.5 * a * math.log(a / m)
        if b > 0:
            total += 0.5 * b * math.log(b / m)
    return total


def ref_prefix(p, x, table, rule):
    """(j*, p̃(x), spent) grown one neighbour at a time, with the moved distribution built explicitly."""
    if rule.method == "sd" or rule.k == 0:
        return 0, p[x], 0.0
    a, s, j, spent = p[x], 0.0, 0, 0.0
    for i, n in enumerate(table[x][: rule.k]):
        s_new = s + p[n]
        if rule.method == "lantern":
            cost, ok = s_new, s_new <= rule.delta
        elif rule.method == "lantern-jsd":
            moved = list(p)
            moved[x] = a + s_new
            for m in table[x][: i + 1]:
                moved[m] = 0.0
            cost = ref_jsd(p, moved)
            ok = cost <= rule.delta
        else:
            ok = s_new <= (rule.lam - 1) * a
            cost = s_new / a if a > 0 else 0.0
        if not ok:
            break
        s, j, spent = s_new, i + 1, cost
    return j, a + s, spent


def ref_residual(p, q, x, table, rule):
    """Residual after rejecting x drawn from q (q None: a deterministic draft), by loops."""
    V = len(p)
    if q is None:
        q = [1.0 if y == x else 0.0 for y in range(V)]
    if rule.convention == "exact":
        alpha = [min(q[y], ref_prefix(p, y, table, rule)[1]) if q[y] < 1 else q[y] for y in range(V)]
        r = [max(p[y] - alpha[y], 0.0) for y in range(V)]
        mass = sum(r)
        return [v / mass for v in r] if mass > 0 else list(p)
    j = ref_prefix(p, x, table, rule)[0]
    zap = set(table[x][: rule.k + 1]) if j >= 1 and rule.method != "sd" and rule.k > 0 else set()
    deterministic = q[x] == 1.0
    if deterministic:  # the dynamic-tree path: p zeroed at x̂ and the zapped neighbours
        r = [0.0 if (y == x or y in zap) else p[y] for y in range(V)]
    else:  # the static-tree path: q zeroed at the zapped neighbours, then max(p - q, 0)
        r = [max(p[y] - (0.0 if y in zap else q[y]), 0.0) for y in range(V)]
    mass = sum(r)
    return [v / mass for v in r] if mass > 0 else [1.0 / V] * V


def ref_output(p, q, table, rule, greedy=False):
    """out(y) = Σ_x q(x) P(acc x) [y=x] + Σ_x q(x) (1 - P(acc x)) residual_x(y), by loops."""
    V = len(p)
    out = [0.0] * V
    top = max(range(V), key=lambda v: (p[v], -v))  # first argmax
    for x in range(V):
        if q[x] == 0:
            continue
        _, pt, _ = ref_prefix(p, x, table, rule)
        if greedy:
            acc = 1.0 if pt >= max(p[v] for v in range(V) if v != x) else 0.0
            res = [1.0 if y == top else 0.0 for y in range(V)]
        else:
            acc = min(1.0, pt / q[x])
            res = ref_residual(p, q, x, table, rule)
        out[x] += q[x] * acc
        for y in range(V):
            out[y] += q[x] * (1 - acc) * res[y]
    return out


def random_case(gen, V, zeros=0):
    """p, q (V,) float64 with ``zeros`` zero entries in p; a full neighbour table (V, V-1)."""
    p = torch.rand(V, generator=gen, dtype=F64) ** 2
    if zeros:
        p[torch.randperm(V, generator=gen)[:zeros]] = 0
    p = p / p.sum()
    q = torch.rand(V, generator=gen, dtype=F64) ** 2
    q = q / q.sum()
    rows = []
    for v in range(V):
        others = [w for w in torch.randperm(V, generator=gen).tolist() if w != v]
        rows.append(others)
    return p, q, nb(rows)


RULES = [
    AcceptanceRule("sd"),
    AcceptanceRule("lantern", k=2, delta=0.1),
    AcceptanceRule("lantern", k=3, delta=0.3),
    AcceptanceRule("lantern-jsd", k=3, delta=0.02),
    AcceptanceRule("lantern-jsd", k=2, delta=0.2),
    AcceptanceRule("lantern++", k=3, lam=1.5),
    AcceptanceRule("lantern++", k=2, lam=3.0),
]


# ----------------------------------------------------------------------------- hand cases
@pytest.mark.parametrize(
    "rule, draft, q_draft, j_star, p_tilde, spent, u_accept, u_reject",
    [
        # sd: p(0) = 1/4, q(0) = 1/2 -> accept prob 1/2.
        (AcceptanceRule("sd"), 0, 8 / 16, 0, 4 / 16, 0.0, 0.49, 0.50),
        # TVD δ = 1/8, x̂ = 0: neighbours 2, 3, 1 -> S = 1/16, 2/16, 4/16 -> j* = 2, p̃ = 6/16,
        # accept prob (6/16)/(8/16) = 3/4.
        (AcceptanceRule("lantern", k=4, delta=2 / 16), 0, 8 / 16, 2, 6 / 16, 2 / 16, 0.74, 0.75),
        # same with k = 1: only n_1 = 2 may move -> j* = 1, p̃ = 5/16, prob 5/8.
        (AcceptanceRule("lantern", k=1, delta=2 / 16), 0, 8 / 16, 1, 5 / 16, 1 / 16, 0.62, 0.625),
        # δ below S_1 = 1/16 -> j* = 0: plain SD.
        (AcceptanceRule("lantern", k=4, delta=0.06), 0, 8 / 16, 0, 4 / 16, 0.0, 0.49, 0.50),
        # x̂ = 5 (p = 4/16): neighbours 4, 6, 7, 1 -> S = 2/16, 3/16, 4/16, 6/16; δ = 1/4 -> j* = 3,
        # p̃ = 8/16 >= q(5) = 4/16 -> always accepted (any u < 1).
        (AcceptanceRule("lantern", k=4, delta=4 / 16), 5, 4 / 16, 3, 8 / 16, 4 / 16, 0.999, None),
        # JSD, x̂ = 0, a = 1/4: JSD(S=1/16) = 0.02340, JSD(S=2/16) = 0.04961 (nats), δ = 0.03 -> j* = 1.
        (AcceptanceRule("lantern-jsd", k=4, delta=0.03), 0, 8 / 16, 1, 5 / 16, 0.0234, 0.62, 0.625),
        # δ = 0.05 -> j* = 2 (JSD(S=4/16) = 0.1079 > 0.05).
        (AcceptanceRule("lantern-jsd", k=4, delta=0.05), 0, 8 / 16, 2, 6 / 16, 0.0496, 0.74, 0.75),
        # LANTERN++ λ = 1.5, x̂ = 0: bound (λ-1) p(x̂) = 1/8 -> j* = 2, spent S/p = 1/2.
        (AcceptanceRule("lantern++", k=4, lam=1.5), 0, 8 / 16, 2, 6 / 16, 0.5, 0.74, 0.75),
        # λ = 1.25 -> bound 1/16 -> j* = 1, spent 1/4.
        (AcceptanceRule("lantern++", k=4, lam=1.25), 0, 8 / 16, 1, 5 / 16, 0.25, 0.62, 0.625),
        # x̂ = 2 (p = 1/16), λ = 1.5 -> bound 1/32 < p(3) = 1/16 -> j* = 0; the TVD rule with δ = 1/8
        # would move n_1 = 3. Accept prob (1/16)/(2/16) = 1/2.
        (AcceptanceRule("lantern++", k=4, lam=1.5), 2, 2 / 16, 0, 1 / 16, 0.0, 0.49, 0.50),
        (AcceptanceRule("lantern", k=4, delta=2 / 16), 2, 2 / 16, 1, 2 / 16, 1 / 16, 0.99, None),
    ],
)
def test_hand_cases(rule, draft, q_draft, j_star, p_tilde, spent, u_accept, u_reject):
    p = t(P8)
    q = torch.full((8,), (1 - q_draft) / 7, dtype=F64)
    q[draft] = q_draft
    table = nb(NB8)
    us = [u_accept] + ([u_reject] if u_reject is not None else [])
    pp, qq = p.expand(len(us), 8), q.expand(len(us), 8)
    d = torch.full((len(us),), draft)
    v = judge(pp, qq, d, t(us), table, rule)
    assert v.j_star.tolist() == [j_star] * len(us)
    assert v.j_star.dtype == torch.int64
    assert torch.allclose(v.p_tilde, t([p_tilde] * len(us)), atol=0, rtol=0)
    assert torch.allclose(v.spent, t([spent] * len(us)), atol=1e-4, rtol=0)
    assert torch.equal(v.p_draft, t([P8[draft]] * len(us)))
    assert torch.equal(v.q_draft, t([q_draft] * len(us)))
    assert v.accepted.tolist() == [True] + ([False] if u_reject is not None else [])
    assert v.accept_prob[0].item() == pytest.approx(min(1.0, p_tilde / q_draft), abs=1e-15)


def test_jsd_hand_values():
    a = t([0.25])
    got = moved_jsd(a, t([1 / 16, 2 / 16, 4 / 16]))
    assert torch.allclose(got, t([0.0234006, 0.0496140, 0.1078808]), atol=1e-6)
    assert moved_jsd(t(0.0), t(1.0)).item() == pytest.approx(math.log(2), abs=1e-15)
    assert moved_jsd(t(0.3), t(0.0)).item() == 0.0


def test_jsd_closed_form_matches_direct():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        p, _, table = random_case(gen, 8, zeros=2)
        x = int(torch.randint(8, (1,), generator=gen))
        S = p[table[x]].cumsum(0)
        closed = moved_jsd(p[x].expand(7), S)
        for j in range(7):
            moved = p.clone()
            moved[x] += S[j]
            moved[table[x][: j + 1]] = 0
            assert closed[j].item() == pytest.approx(jsd(p, moved).item(), abs=1e-12)
            assert closed[j].item() == pytest.approx(ref_jsd(p.tolist(), moved.tolist()), abs=1e-12)
        assert (closed.diff() >= -1e-15).all()  # grows with the prefix


def test_tvd_and_jsd_direct():
    p, r = t([0.5, 0.5, 0.0]), t([0.0, 0.5, 0.5])
    assert tvd(p, r).item() == 0.5
    # m = (1/4, 1/2, 1/4): JSD = ½ (½ ln 2) + ½ (½ ln 2) = ½ ln 2
    assert jsd(p, r).item() == pytest.approx(0.5 * math.log(2), abs=1e-15)
    assert jsd(p, p).item() == 0.0


# ----------------------------------------------------------------------------- exact enumeration
@pytest.mark.parametrize("convention", ["exact", "official"])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.method}-k{r.k}")
def test_output_distribution_matches_loop_reference(rule, convention):
    rule = AcceptanceRule(rule.method, rule.k, rule.delta, rule.lam, convention)
    gen = torch.Generator().manual_seed(1)
    for V in (4, 6, 8):
        for zeros in (0, 2):
            p, q, table = random_case(gen, V, zeros)
            out = output_distribution(p, q, table, rule)
            ref = ref_output(p.tolist(), q.tolist(), table.tolist(), rule)
            assert torch.allclose(out, t(ref), atol=1e-12, rtol=0)
            assert out.sum().item() == pytest.approx(1.0, abs=1e-12)
            # every draft x: p̃, j*, and the verdict at both sides of the threshold
            xs = torch.arange(V)
            v = judge(p.expand(V, V), q.expand(V, V), xs, torch.zeros(V, dtype=F64), table, rule)
            for x in range(V):
                j, pt, spent = ref_prefix(p.tolist(), x, table.tolist(), rule)
                assert v.j_star[x].item() == j
                assert v.p_tilde[x].item() == pytest.approx(pt, abs=1e-12)
                assert v.spent[x].item() == pytest.approx(spent, abs=1e-12)
                prob = min(1.0, pt / q[x].item())
                assert v.accept_prob[x].item() == pytest.approx(prob, abs=1e-12)
                for u, want in ((prob - 1e-9, True), (prob + 1e-9, False)):
                    if 0 <= u < 1:
                        got = judge(p, q, torch.tensor(x), t(u), table, rule).accepted.item()
                        assert got == want
                r = residual(p, q, torch.tensor(x), table, rule)
                assert torch.allclose(r, t(ref_residual(p.tolist(), q.tolist(), x, table.tolist(), rule)), atol=1e-12)
                r = residual(p, None, torch.tensor(x), table, rule)  # a deterministic draft
                assert torch.allclose(r, t(ref_residual(p.tolist(), None, x, table.tolist(), rule)), atol=1e-12)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.method}-k{r.k}")
def test_greedy_output_matches_loop_reference(rule):
    gen = torch.Generator().manual_seed(2)
    for V in (4, 8):
        p, q, table = random_case(gen, V, zeros=1)
        out = output_distribution(p, q, table, rule, greedy=True)
        assert torch.allclose(out, t(ref_output(p.tolist(), q.tolist(), table.tolist(), rule, greedy=True)), atol=1e-12)


@pytest.mark.parametrize(
    "rule",
    [
        AcceptanceRule("sd"),
        AcceptanceRule("lantern", k=3, delta=0.0),
        AcceptanceRule("lantern-jsd", k=3, delta=0.0),
        AcceptanceRule("lantern++", k=3, lam=1.0),
        AcceptanceRule("lantern", k=0, delta=0.5),
        AcceptanceRule("lantern-jsd", k=0, delta=0.5),
        AcceptanceRule("lantern++", k=0, lam=4.0),
    ],
    ids=lambda r: f"{r.method}-k{r.k}",
)
def test_lossless_when_nothing_moves(rule):
    """δ = 0 (λ = 1) or k = 0 with the exact residual: the output distribution is exactly p,
    also when p has zero entries (zero-mass neighbours are "moved" at no cost)."""
    gen = torch.Generator().manual_seed(3)
    for V, zeros in ((4, 0), (6, 2), (8, 3)):
        p, q, table = random_case(gen, V, zeros)
        assert torch.allclose(output_distribution(p, q, table, rule), p, atol=1e-14, rtol=0)
        # batched (B, γ, V)
        pp = torch.stack([p, q]).unsqueeze(0).expand(3, 2, V)
        qq = torch.stack([q, p]).unsqueeze(0).expand(3, 2, V)
        assert torch.allclose(output_distribution(pp, qq, table, rule), pp, atol=1e-14, rtol=0)


def test_official_at_delta_zero_is_lossless_only_while_no_neighbour_is_zapped():
    """Sampled drafts, δ = 0: with every neighbour of positive mass nothing moves (j* = 0) and the
    official residual is the exact one; a neighbour cut to p = 0 (e.g. by top-k) still counts as
    moved, B_{k+1} is zeroed in q and the output leaves p."""
    gen = torch.Generator().manual_seed(4)
    official = AcceptanceRule("lantern", k=2, delta=0.0, convention="official")
    p, q, table = random_case(gen, 6)
    assert torch.allclose(output_distribution(p, q, table, official), p, atol=1e-14)
    p, q, table = random_case(gen, 6, zeros=2)
    assert tvd(output_distribution(p, q, table, official), p).item() > 1e-3
    assert torch.allclose(output_distribution(p, q, table, AcceptanceRule("lantern", k=2, delta=0.0)), p, atol=1e-14)


def test_official_deterministic_residual_zeroes_b_k_plus_one():
    """Hand case (dynamic tree, q(x̂) = 1): after rejecting x̂ = 0 with j* = 2 of k = 2 the official
    code zeroes p at 0 and at nearest_latents[0, :3] = {2, 3, 1}; with j* = 0 only at 0."""
    p, table = t(P8), nb(NB8)
    rule = AcceptanceRule("lantern", k=2, delta=2 / 16, convention="official")
    r = residual(p, None, torch.tensor(0), table, rule)
    # left: codes 4, 5, 6, 7 with 2, 4, 1, 1 sixteenths -> /8
    assert torch.equal(r, t([0, 0, 0, 0, 2 / 8, 4 / 8, 1 / 8, 1 / 8]))
    # table with only k columns: B_k = {2, 3}
    r = residual(p, None, torch.tensor(0), table[:, :2], rule)
    assert torch.equal(r, t([0, 2 / 10, 0, 0, 2 / 10, 4 / 10, 1 / 10, 1 / 10]))
    # δ below S_1 -> j* = 0 -> only x̂ zeroed (= the exact residual of a deterministic draft)
    for rule0 in (AcceptanceRule("lantern", k=2, delta=0.01, convention="official"), AcceptanceRule("sd")):
        r = residual(p, None, torch.tensor(0), table, rule0)
        assert torch.equal(r, t([0, 2 / 12, 1 / 12, 1 / 12, 2 / 12, 4 / 12, 1 / 12, 1 / 12]))
    # δ = 0 but n_1 = 1 has p = 0 (cut by top-k): j* = 1, so {0} ∪ B_2(0) = {0, 1, 2} is zeroed
    p0 = t([8, 0, 4, 4]) / 16
    t0 = nb([[1, 2, 3], [0, 2, 3], [3, 0, 1], [2, 0, 1]])
    rule = AcceptanceRule("lantern", k=1, delta=0.0, convention="official")
    assert relaxed_mass(p0, torch.tensor(0), t0, rule)[0].item() == 1
    assert torch.equal(residual(p0, None, torch.tensor(0), t0, rule), t([0, 0, 0, 1.0]))
    assert torch.equal(residual(p0, None, torch.tensor(0), t0, AcceptanceRule("lantern", k=1)), t([0, 0, 4, 4]) / 8)


def test_official_sampled_residual_hand_case():
    """Hand case (static tree / chain, q given): p = (8, 4, 2, 2)/16, q = (4, 8, 2, 2)/16,
    B: 1 -> (0, 3), 2 -> (3, 0), k = 1, δ = 1/8. x̂ = 1: S_1 = p(0) = 1/2 > δ, j* = 0, nothing is
    zapped: norm(max(p - q, 0)) = e_0. x̂ = 2: S_1 = p(3) = 1/8 <= δ, j* = 1, q is zeroed at
    B_2(2) = {3, 0}: q'' = (0, 8, 2, 0)/16, max(p - q'', 0) = (8, 0, 0, 2)/16 -> (4/5, 0, 0, 1/5)."""
    p, q = t([8, 4, 2, 2]) / 16, t([4, 8, 2, 2]) / 16
    table = nb([[1, 2], [0, 3], [3, 0], [2, 1]])
    rule = AcceptanceRule("lantern", k=1, delta=2 / 16, convention="official")
    assert torch.equal(residual(p, q, torch.tensor(1), table, rule), t([1, 0, 0, 0]))
    assert torch.allclose(residual(p, q, torch.tensor(2), table, rule), t([0.8, 0, 0, 0.2]), atol=1e-15)
    exact = AcceptanceRule("lantern", k=1, delta=2 / 16)
    assert torch.equal(residual(p, q, torch.tensor(2), table, exact), t([1, 0, 0, 0]))


def test_exact_residual_hand_case():
    """V = 4, p = (1/2, 1/4, 1/8, 1/8), q = (1/4, 1/2, 1/8, 1/8), B_1: 0->1, 1->0, 2->3, 3->2,
    δ = 1/8: p̃_0(0) = 1/2 (p(1) = 1/4 > δ), p̃_1(1) = 1/4, p̃_2(2) = 1/4, p̃_3(3) = 1/4.
    α = min(q, p̃) = (1/4, 1/4, 1/8, 1/8); max(p - α, 0) = (1/4, 0, 0, 0) -> residual = e_0.
    out = α + (1 - Σα) e_0 = (1/2, 1/4, 1/8, 1/8) = p (q(2), q(3) <= p̃, no extra mass)."""
    p, q = t([8, 4, 2, 2]) / 16, t([4, 8, 2, 2]) / 16
    table = nb([[1, 2], [0, 3], [3, 0], [2, 1]])
    rule = AcceptanceRule("lantern", k=1, delta=2 / 16)
    assert torch.equal(residual(p, q, torch.tensor(1), table, rule), t([1, 0, 0, 0]))
    assert torch.equal(output_distribution(p, q, table, rule), p)
    # q(2) = 1/4 > p(2): now α(2) = p̃_2(2) = 1/4 > p(2) = 1/8 -> out(2) = 1/4
    q2 = t([2, 8, 4, 2]) / 16
    out = output_distribution(p, q2, table, rule)
    # α = (1/8, 1/4, 1/4, 1/8); max(p - α, 0) = (3/8, 0, 0, 0); reject mass 1 - 3/4 = 1/4
    assert torch.equal(out, t([6, 4, 4, 2]) / 16)


def test_exact_residual_is_standard_residual():
    """norm(max(p - α, 0)) with α(x) = min(q(x), p̃_x(x)) built from every draft's p̃ equals
    norm(max(p - q, 0)), because p̃_x(x) >= p(x)."""
    gen = torch.Generator().manual_seed(7)
    for rule in RULES:
        p, q, table = random_case(gen, 8, zeros=2)
        _, p_tilde, _ = relaxed_mass(p.expand(8, 8), torch.arange(8), table, rule)
        r = (p - torch.minimum(q, p_tilde)).clamp_min(0)
        assert torch.allclose(residual(p, q, torch.tensor(3), table, rule), r / r.sum(), atol=1e-15)
        standard = (p - q).clamp_min(0)
        assert torch.allclose(r / r.sum(), standard / standard.sum(), atol=1e-15)


def test_zero_mass_residual_falls_back_to_p_or_uniform():
    p = t([0.5, 0.5, 0.0, 0.0])
    table = nb([[1, 2, 3], [0, 2, 3], [3, 0, 1], [2, 0, 1]])
    # exact, q = p: α = p, max(p - α, 0) = 0 -> p
    assert torch.equal(residual(p, p, torch.tensor(0), table, AcceptanceRule("sd")), p)
    # official, deterministic draft, j* = 3 >= 1: zeroes {0, 1, 2, 3} -> uniform (the official code)
    rule = AcceptanceRule("lantern", k=3, delta=0.5, convention="official")
    assert torch.equal(residual(p, None, torch.tensor(0), table, rule), t([0.25] * 4))


# ----------------------------------------------------------------------------- distortion bounds
def test_tvd_rule_distortion_bound():
    """For the TVD rule every draft's move costs S_j* <= δ; with the exact residual the output's
    TVD from p equals Σ_y max(α(y) - p(y), 0) — the least any residual can give for the same
    acceptance — and is <= Σ_y min(max(q(y) - p(y), 0), δ) and <= TVD(p, q)."""
    gen = torch.Generator().manual_seed(5)
    for trial in range(40):
        V = 4 + trial % 5
        p, q, table = random_case(gen, V, zeros=trial % 3)
        delta = [0.02, 0.1, 0.3][trial % 3]
        k = 1 + trial % (V - 2)
        exact = AcceptanceRule("lantern", k=k, delta=delta)
        official = AcceptanceRule("lantern", k=k, delta=delta, convention="official")
        xs = torch.arange(V)
        j, pt, spent = relaxed_mass(p.expand(V, V), xs, table, exact)
        assert (spent <= delta).all() and torch.allclose(pt - p, spent, atol=1e-15)
        d_exact = tvd(output_distribution(p, q, table, exact), p).item()
        alpha = torch.minimum(q, pt)
        assert d_exact == pytest.approx((alpha - p).clamp_min(0).sum().item(), abs=1e-12)
        assert d_exact <= (q - p).clamp_min(0).clamp_max(delta).sum().item() + 1e-12
        assert d_exact <= tvd(p, q).item() + 1e-12
        assert d_exact <= tvd(output_distribution(p, q, table, official), p).item() + 1e-12


def test_output_tvd_can_exceed_delta():
    """The δ bound is per draft, not on the output: p = (1/8, 1/8, 3/8, 3/8), q = (1/2, 1/2, 0, 0),
    B_1: 0->2, 1->3, δ = 3/8: p̃(0) = p̃(1) = 1/2 = q, every draft is accepted, out = q and
    TVD(out, p) = 3/4 > δ."""
    p, q = t([2, 2, 6, 6]) / 16, t([8, 8, 0, 0]) / 16
    table = nb([[2], [3], [0], [1]])
    for mode in ("exact", "official"):
        out = output_distribution(p, q, table, AcceptanceRule("lantern", k=1, delta=6 / 16, convention=mode))
        assert torch.equal(out, q)
        assert tvd(out, p).item() == 0.75


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("V,ks", [(9, (1, 3, 8)), (2048, (100, 300, 700))])
def test_output_distributions_equal_one_rule_at_a_time(dtype, V, ks):
    """The shared pass (one gather and cumulative sum at the largest k, every δ of the TVD rule in one
    search) gives the same floats as :func:`output_distribution` rule by rule: TVD, JSD and LANTERN++
    bounds at several k, δ = 0 and 1, zeros in q, and the rules it hands on (sd, k = 0, official).
    V = 2048 runs the vectorised cumulative sum over rows of several hundred entries."""
    gen = torch.Generator().manual_seed(11)
    p = torch.softmax(3 * torch.randn(3, V, generator=gen, dtype=dtype), -1)
    q = torch.softmax(3 * torch.randn(3, V, generator=gen, dtype=dtype), -1)
    q[0, : V // 3] = 0
    q[0] /= q[0].sum()
    table = torch.stack([torch.randperm(V, generator=gen)[: max(ks)] for _ in range(V)])
    rules = [AcceptanceRule("lantern", k=k, delta=d) for k in ks for d in (0.0, 0.05, 0.4, 1.0)]
    rules += [AcceptanceRule("lantern-jsd", k=k, delta=0.03) for k in ks]
    rules += [
        AcceptanceRule("lantern++", k=ks[1], lam=2.0),
        AcceptanceRule("sd"),
        AcceptanceRule("lantern", k=0, delta=0.1),
        AcceptanceRule("lantern", k=ks[0], delta=0.1, convention="official"),
    ]
    outs = output_distributions(p, q, table, rules)
    assert len(outs) == len(rules)
    for rule, out in zip(rules, outs):
        assert torch.equal(out, output_distribution(p, q, table, rule)), rule
    tol = 1e-6 if dtype == torch.float32 else 1e-15
    assert torch.allclose(outs[0], p, rtol=0, atol=tol)  # δ = 0 is lossless (up to rounding)


# ----------------------------------------------------------------------------- greedy
def test_greedy_hand_cases():
    # p = (3/8, 1/4, 1/8, 1/8, 1/8); B_2: 1 -> (2, 3), 3 -> (4, 2), 2 -> (3, 0), ...
    p = t([6, 4, 2, 2, 2]) / 16
    table = nb([[1, 2], [2, 3], [3, 0], [4, 2], [3, 0]])
    d = torch.tensor([0, 1, 2, 3])
    pp = p.expand(4, 5)
    sd = judge_greedy(pp, d, table, AcceptanceRule("sd"))
    assert sd.accepted.tolist() == [True, False, False, False]
    assert torch.equal(sd.q_draft, torch.ones(4, dtype=F64))
    # δ = 1/8: x̂ = 1 moves code 2 -> p̃ = 6/16 >= p(0) = 6/16 (tie: accepted; the official argmax
    # would pick code 0); x̂ = 2 moves 3 -> 4/16 < 6/16; x̂ = 3 moves 4 -> 4/16 < 6/16.
    lan = judge_greedy(pp, d, table, AcceptanceRule("lantern", k=2, delta=2 / 16))
    assert lan.accepted.tolist() == [True, True, False, False]
    assert lan.j_star.tolist() == [0, 1, 1, 1]
    assert torch.equal(lan.p_tilde, t([6, 6, 4, 4]) / 16)
    assert torch.equal(lan.accept_prob, t([1.0, 1.0, 0.0, 0.0]))
    # δ = 1/4: x̂ = 3 moves 4 and 2 -> 6/16: accepted (tie); x̂ = 2 moves 3, then 0 (6/16) breaks.
    wide = judge_greedy(pp, d, table, AcceptanceRule("lantern", k=2, delta=4 / 16))
    assert wide.accepted.tolist() == [True, True, False, True]
    # λ = 2 (move at most p(x̂)): x̂ = 0 moves 1, 2 (6/16) -> 12/16; x̂ = 1 (4/16) moves 2, 3 -> 8/16;
    # x̂ = 2 (2/16) moves 3 -> 4/16 < 6/16 rejected; x̂ = 3 (2/16) moves 4, not 2 -> 4/16 rejected.
    pp2 = judge_greedy(pp, d, table, AcceptanceRule("lantern++", k=2, lam=2.0))
    assert pp2.accepted.tolist() == [True, True, False, False]
    assert pp2.j_star.tolist() == [2, 2, 1, 1]
    assert pp2.p_tilde.tolist() == [12 / 16, 8 / 16, 4 / 16, 4 / 16]
    assert pp2.spent.tolist() == [1.0, 1.0, 1.0, 1.0]
    # output: a rejected greedy draft emits argmax p = 0
    q = t([0, 0, 1.0, 0, 0])
    out = output_distribution(p, q, table, AcceptanceRule("lantern", k=2, delta=2 / 16), greedy=True)
    assert torch.equal(out, t([1.0, 0, 0, 0, 0]))
    q = t([0, 1.0, 0, 0, 0])
    out = output_distribution(p, q, table, AcceptanceRule("lantern", k=2, delta=2 / 16), greedy=True)
    assert torch.equal(out, q)


def test_greedy_argmax_tie():
    p = t([0.25, 0.25, 0.5])
    v = judge_greedy(p.expand(3, 3), torch.tensor([0, 1, 2]), None, AcceptanceRule("sd"))
    assert v.accepted.tolist() == [False, False, True]
    p = t([0.5, 0.5, 0.0])
    v = judge_greedy(p.expand(3, 3), torch.tensor([0, 1, 2]), None, AcceptanceRule("sd"))
    assert v.accepted.tolist() == [True, True, False]


# ----------------------------------------------------------------------------- batching
@pytest.mark.parametrize("mode", ["exact", "official"])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.method}-k{r.k}")
def test_batched_matches_per_element(rule, mode):
    rule = AcceptanceRule(rule.method, rule.k, rule.delta, rule.lam, mode)
    gen = torch.Generator().manual_seed(6)
    B, G, V = 3, 4, 8
    p = torch.rand(B, G, V, generator=gen) ** 3
    p[..., :2] = 0  # zero-mass codes, as after top-k
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(B, G, V, generator=gen)
    q = q / q.sum(-1, keepdim=True)
    draft = torch.randint(V, (B, G), generator=gen)
    u = torch.rand(B, G, generator=gen)
    table = random_case(gen, V)[2]
    v = judge(p, q, draft, u, table, rule)
    g = judge_greedy(p, draft, table, rule)
    r = residual(p, q, draft, table, rule)
    out = output_distribution(p, q, table, rule)
    assert v.accepted.shape == (B, G) and r.shape == (B, G, V) and out.shape == (B, G, V)
    assert r.dtype == torch.float32 and v.p_tilde.dtype == torch.float32
    for b in range(B):
        for i in range(G):
            one = judge(p[b, i], q[b, i], draft[b, i], u[b, i], table, rule)
            for name in ("accepted", "accept_prob", "p_draft", "q_draft", "p_tilde", "j_star", "spent"):
                assert torch.equal(getattr(v, name)[b, i], getattr(one, name)), name
            assert torch.equal(g.accepted[b, i], judge_greedy(p[b, i], draft[b, i], table, rule).accepted)
            assert torch.allclose(r[b, i], residual(p[b, i], q[b, i], draft[b, i], table, rule), atol=1e-7)
            assert torch.allclose(out[b, i], output_distribution(p[b, i], q[b, i], table, rule), atol=1e-6)


# ----------------------------------------------------------------------------- relaxations
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.method}-k{r.k}")
def test_places_and_walk_leave_the_neighbourhood_rules_unchanged(rule):
    """The chain arguments of judge / residual and the walk are identities for the rules of BOUNDS."""
    gen = torch.Generator().manual_seed(9)
    B, G, V = 2, 3, 8
    p = torch.softmax(torch.randn(B, G, V, generator=gen, dtype=F64) * 2, -1)
    q = torch.softmax(torch.randn(B, G, V, generator=gen, dtype=F64), -1)
    draft = torch.randint(V, (B, G), generator=gen)
    u = torch.rand(B, G, generator=gen, dtype=F64)
    table = random_case(gen, V)[2]
    lengths = torch.tensor([[3], [1]])
    v = judge(p, q, draft, u, table, rule)
    w = judge(p, q, draft, u, table, rule, positions=torch.arange(G).expand(B, G), lengths=lengths)
    for name in ("accepted", "accept_prob", "p_draft", "q_draft", "p_tilde", "j_star", "spent"):
        assert torch.equal(getattr(v, name), getattr(w, name)), name
    assert walk(v.accepted, v, rule) is v.accepted
    at = torch.tensor([0, 2])
    r = residual(p[:, 0], q[:, 0], draft[:, 0], table, rule, positions=at, lengths=lengths[:, 0])
    assert torch.equal(r, residual(p[:, 0], q[:, 0], draft[:, 0], table, rule))


def test_relaxations_have_no_neighbourhood_and_default_knobs():
    assert set(RELAXATIONS) <= set(BOUNDS) and all(BOUNDS[m] is None for m in RELAXATIONS)
    for method, relax in RELAXATIONS.items():
        rule = AcceptanceRule(method)
        assert not rule.relaxed and all(hasattr(rule, name) for name in relax.parameters)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(method="medusa"), "unknown acceptance method"),
        (dict(method="lantern", delta=-0.1), r"AcceptanceRule.delta must be >= 0"),
        (dict(method="lantern", delta=float("nan")), r"AcceptanceRule.delta must be >= 0"),
        (dict(method="lantern", delta=1.5), "lantern++"),
        (dict(method="lantern++", lam=0.5), r"AcceptanceRule.lam must be >= 1"),
        (dict(method="lantern", k=-1), r"AcceptanceRule.k must be an integer >= 0"),
        (dict(method="lantern", k=2.5), r"AcceptanceRule.k must be an integer >= 0"),
        (dict(convention="uniform"), "unknown convention"),
    ],
)
def test_bad_rule_raises_usage_error(kwargs, needle):
    with pytest.raises(UsageError, match=needle.replace("+", r"\+")) as err:
        AcceptanceRule(**kwargs)
    assert "\n" not in str(err.value)


def test_bad_application_raises_usage_error():
    p = t(P8)
    q = torch.full((8,), 1 / 8, dtype=F64)
    x, u = torch.tensor(0), t(0.5)
    table = nb(NB8)
    cases = [
        (
            lambda: judge(p, q, x, u, nb([[1]] * 8), AcceptanceRule("lantern", k=8, delta=0.1)),
            "smaller than the vocabulary",
        ),
        (lambda: judge(p, q, x, u, None, AcceptanceRule("lantern", k=2, delta=0.1)), "needs a neighbour table"),
        (lambda: judge(p, q, x, u, table[:, :1], AcceptanceRule("lantern", k=2, delta=0.1)), "at least k columns"),
        (lambda: judge(p, q, x, u, table[:4], AcceptanceRule("lantern", k=2, delta=0.1)), "at least k columns"),
        (lambda: judge(p, q[:4], x, u, table, AcceptanceRule("sd")), "q has shape"),
        (lambda: judge(p, q, torch.tensor([0, 1]), u, table, AcceptanceRule("sd")), "draft has shape"),
        (lambda: judge(p, q, x, t([0.5, 0.5]), table, AcceptanceRule("sd")), "u has shape"),
        (lambda: residual(p, q, torch.tensor([0]), table, AcceptanceRule("sd")), "draft has shape"),
        (lambda: relaxed_mass(torch.ones(8, dtype=torch.long), x, table, AcceptanceRule("sd")), "floating"),
    ]
    for call, needle in cases:
        with pytest.raises(UsageError, match=needle) as err:
            call()
        assert "\n" not in str(err.value)
    # sd and k = 0 need no table
    assert judge(p, q, x, u, None, AcceptanceRule("lantern", k=0, delta=0.3)).accepted.item()


def test_accepts_neighbourhoods_object():
    from ambiguity.neighbourhood import Neighbourhoods

    table = nb(NB8)
    nbhd = Neighbourhoods(indices=table, distances=torch.zeros(table.shape), metric="l2")
    rule = AcceptanceRule("lantern", k=4, delta=2 / 16)
    p, q = t(P8), torch.full((8,), 1 / 8, dtype=F64)
    a = judge(p, q, torch.tensor(0), t(0.9), nbhd, rule)
    b = judge(p, q, torch.tensor(0), t(0.9), table, rule)
    assert a.j_star.item() == b.j_star.item() == 2 and a.accepted.item() and b.accepted.item()
