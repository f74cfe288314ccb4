"""ambiguity.stats on hand-computed distributions."""

import math

import pytest
import torch

from ambiguity.stats import STAT_NAMES, chosen_prob, chosen_rank, entropy, token_stats, top1_prob, topk_mass

P = torch.tensor([0.5, 0.25, 0.125, 0.125])


def test_hand_computed_distribution():
    assert top1_prob(P).item() == 0.5
    assert topk_mass(P, 2).item() == 0.75
    assert topk_mass(P, 10).item() == 1.0  # k > V is clipped to V
    # H = 0.5 ln 2 + 0.25 ln 4 + 2 * 0.125 ln 8 = 1.75 ln 2
    assert entropy(P).item() == pytest.approx(1.75 * math.log(2), abs=1e-6)
    assert chosen_prob(P, torch.tensor(1)).item() == 0.25
    assert chosen_rank(P, torch.tensor(0)).item() == 1
    assert chosen_rank(P, torch.tensor(1)).item() == 2


def test_ties_share_the_best_rank():
    # tokens 2 and 3 tie at 0.125: both have two strictly larger tokens -> rank 3
    assert chosen_rank(P, torch.tensor(2)).item() == 3
    assert chosen_rank(P, torch.tensor(3)).item() == 3
    q = torch.tensor([0.4, 0.4, 0.2])
    assert chosen_rank(q.expand(3, 3), torch.tensor([0, 1, 2])).tolist() == [1, 1, 3]
    # the argmax (greedy choice) is always rank 1, also for a uniform distribution
    u = torch.full((16,), 1 / 16)
    assert chosen_rank(u, torch.tensor(7)).item() == 1


def test_zero_probabilities_and_extremes():
    one_hot = torch.tensor([0.0, 1.0, 0.0, 0.0])
    assert entropy(one_hot).item() == 0.0  # 0 log 0 = 0, no NaN
    assert chosen_rank(one_hot, torch.tensor(0)).item() == 2  # every zero-mass token ranks after the top one
    u = torch.full((16,), 1 / 16)
    assert entropy(u).item() == pytest.approx(math.log(16), abs=1e-6)
    assert top1_prob(u).item() == pytest.approx(1 / 16)
    assert topk_mass(u, 10).item() == pytest.approx(10 / 16)
    # filtered distributions (zeros after top-k) still give finite entropy
    filtered = torch.tensor([0.7, 0.3, 0.0, 0.0, 0.0])
    assert entropy(filtered).item() == pytest.approx(-(0.7 * math.log(0.7) + 0.3 * math.log(0.3)), abs=1e-6)


def test_top10_mass_of_twelve_tokens():
    p = torch.tensor([0.2, 0.15, 0.1, 0.1, 0.1, 0.08, 0.07, 0.06, 0.05, 0.04, 0.03, 0.02])
    assert topk_mass(p, 10).item() == pytest.approx(1 - 0.03 - 0.02, abs=1e-6)
    with pytest.raises(ValueError):
        topk_mass(p, 0)


def test_batched_shapes_match_a_loop():
    g = torch.Generator().manual_seed(0)
    p = torch.distributions.Dirichlet(torch.full((50,), 0.3)).sample((2, 3))
    tokens = torch.randint(0, 50, (2, 3), generator=g)
    s = token_stats(p, tokens)
    assert set(s) == set(STAT_NAMES)
    for k, v in s.items():
        assert v.shape == (2, 3), k
    assert s["chosen_rank"].dtype == torch.int64
    for i in range(2):
        for j in range(3):
            row, t = p[i, j], tokens[i, j].item()
            assert s["top1"][i, j].item() == pytest.approx(row.max().item())
            assert s["top10"][i, j].item() == pytest.approx(
                row.sort(descending=True).values[:10].sum().item(), abs=1e-6
            )
            assert s["entropy"][i, j].item() == pytest.approx(-(row * row.log()).sum().item(), abs=1e-5)
            assert s["chosen_prob"][i, j].item() == row[t].item()
            order = row.argsort(descending=True).tolist()
            assert s["chosen_rank"][i, j].item() == order.index(t) + 1  # no ties in a continuous sample


def test_half_precision_is_computed_in_float32():
    p = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float16)
    s = token_stats(p, torch.tensor([2]))
    assert s["entropy"].dtype == torch.float32
    assert s["entropy"].item() == pytest.approx(1.5 * math.log(2), abs=1e-3)
    assert s["chosen_rank"].item() == 2
