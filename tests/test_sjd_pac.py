"""SJD-PAC (lantern.methods.sjd_pac) on tiny random models.

* the official tree layout (L = 64, K = 3, D = 3: a 13-node tree, a main path of 54 nodes);
* exhaustive enumeration of the real decoder (every coin, uniform new position, sibling drawn
  without replacement, residual and continuation draw branched with its probability): the joint of
  an image's tokens is exactly AR sampling's (1e-12), with guidance, temperature, top-k and top-p,
  both continuation rules, accepted paths through later siblings included;
* greedy SJD-PAC equals greedy AR token for token; batch 1 == batch 3 in float64 (tokens and
  records), images entering freed slots;
* one-line errors for bad knobs; the generate CLI;
* the official verifier (the longest accepted row) is not lossless: exact enumeration of one
  verification's first token gives a TVD of 0.018 to p on a 4-code case.
"""

import itertools

import numpy as np
import pytest
import torch
from test_engine import _same_records
from test_jacobi import _prefix_joint
from test_trees import enumerate_outcomes, exact_joint, tiny

from ambiguity.errors import UsageError
from ambiguity.generation import sample_tokens
from ambiguity.sampling import SamplingConfig
from lantern.engine.decode import DecodeConfig, decode
from lantern.methods.sjd_pac.config import PacConfig, check_pac, pac_tree
from lantern.methods.sjd_pac.method import sibling_q
from lantern.rules.jacobi import sjd_accept_prob, sjd_residual


def test_official_tree_layout():
    t = pac_tree(64, 3, 3)
    assert t.nodes == 64 and t.main == 54  # 13 tree nodes; the first-sibling path runs on to 54 nodes
    assert t.depth[:54] == tuple(range(54)) and t.parent[:54] == (-1, *range(53))
    assert t.children[0] == (1, 54, 55) and t.children[1] == (2, 56, 57)  # K siblings at depths 1, 2
    assert t.children[54] == (58, 59, 60) and t.children[58] == () and t.children[2] == (3,)
    assert [t.branch[c] for c in t.children[55]] == [0, 1, 2] and set(t.depth[54:]) == {1, 2}
    assert t.ancestors.sum().item() == sum(d + 1 for d in t.depth)
    assert t.ancestors[59].nonzero()[:, 0].tolist() == [0, 54, 59]
    small = pac_tree(5, 2, 2)  # root, main 1..3, one more sibling at depth 1
    assert small.parent == (-1, 0, 1, 2, 0) and small.branch == (0, 0, 0, 0, 1) and small.children[0] == (1, 4)
    assert pac_tree(4, 1, 1).children == ((1,), (2,), (3,), ())  # K = 1 or D = 1: a Jacobi chain


def test_sibling_q_draws_without_replacement():
    base = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    like = base
    assert torch.allclose(sibling_q(base, [], 4, like), base)
    assert torch.allclose(sibling_q(base, [0], 4, like), torch.tensor([0, 0.6, 0.4, 0], dtype=torch.float64))
    assert torch.allclose(sibling_q(base, [0, 1, 2], 4, like), torch.tensor([0, 0, 0, 1.0], dtype=torch.float64))
    assert torch.allclose(sibling_q(None, [2], 4, like), torch.tensor([1, 1, 0, 1], dtype=torch.float64) / 3)


def _joint(m, pac, s, N=None):
    cfg = DecodeConfig.of("sjd-pac", **pac)
    seen = dict(accepted=0, rejected=0, later_sibling=0)

    def run(draws):
        out = decode(m, [1], cfg, s, draws={0: draws}, num_tokens=N)
        d = out.drafts
        seen["accepted"] += int(out.steps["accepted"].sum())
        seen["rejected"] += int((d["reached"] & ~d["accepted"]).sum())
        seen["later_sibling"] += int((d["committed"] & (d["sibling"] > 0)).sum())
        return tuple(out.tokens[0].tolist())

    got, runs = enumerate_outcomes(run)
    want = exact_joint(m, 1, s) if N is None else _prefix_joint(m, 1, s, N)
    return got, want, runs, seen


CASES = {  # model, knobs, sampling, tokens decoded (None: the whole 2 x 2 image)
    "K2-D2": (
        dict(vocab=4, block=4),
        dict(window=4, width=2, depth=2),
        SamplingConfig(guidance=1.0, temperature=1.0, top_k=2),
        None,
    ),
    "K2-D3": (  # two branching levels: the same candidates under every parent, AC into the tree
        dict(vocab=3, block=9, std=1.0),
        dict(window=7, width=2, depth=3),
        SamplingConfig(guidance=2.0, temperature=0.7, top_k=2),
        5,
    ),
    "K3-D2-top-p": (
        dict(vocab=3, block=9, std=1.0),
        dict(window=5, width=3, depth=2),
        SamplingConfig(guidance=1.5, temperature=1.3, top_p=0.8),
        5,
    ),
    "resample": (
        dict(vocab=3, block=9, std=1.0),
        dict(window=4, width=2, depth=2, continuation="resample"),
        SamplingConfig(guidance=2.0, temperature=1.0),
        4,
    ),
}


@pytest.mark.slow  # 1-20 s each: a few hundred to a few thousand enumerated decodes
@pytest.mark.parametrize("case", CASES)
def test_sjd_pac_is_exactly_ar_sampling(case):
    """Every outcome of the decoder weighted by its probability is the AR joint of the tokens
    decoded: siblings after the first are accepted, drafts rejected and kept."""
    model, pac, sampling, N = CASES[case]
    got, want, runs, seen = _joint(tiny(**model), pac, sampling, N)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12) and runs > 50
    assert set(got) <= set(want)
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), seq
    assert seen["accepted"] > 0 and seen["rejected"] > 0 and seen["later_sibling"] > 0


def test_greedy_sjd_pac_equals_greedy_ar():
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    accepted = later = 0
    for guidance, label in ((1.0, 0), (3.0, 5), (1.0, 3)):
        s = SamplingConfig(guidance=guidance, temperature=0.0)
        ar = sample_tokens(m, m.make_prompt([label], guided=s.guided), s)
        for pac in (dict(window=8, width=2, depth=3), dict(window=16, width=3, depth=2), dict(window=4, width=1)):
            out = decode(m, [label], DecodeConfig.of("sjd-pac", **pac), s)
            assert torch.equal(out.tokens, ar), (pac, guidance)
            accepted += int(out.steps["accepted"].sum())
            later += int((out.drafts["committed"] & (out.drafts["sibling"] > 0)).sum())
    assert accepted > 0 and later > 0
    s = SamplingConfig(guidance=2.0, temperature=0.0)
    out = decode(m, [2, 6, 8, 0], DecodeConfig.of("sjd-pac", window=8, width=2, depth=3), s, batch_size=3)
    ar = torch.cat([sample_tokens(m, m.make_prompt([c], guided=True), s) for c in (2, 6, 8, 0)])
    assert torch.equal(out.tokens, ar)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(guidance=2.0, temperature=1.0, top_k=16),
        SamplingConfig(guidance=1.0, temperature=0.8, top_p=0.9),
        SamplingConfig(guidance=2.0, temperature=0.0),
    ],
)
def test_float64_batched_sjd_pac_equals_batch_one(sampling):
    """7 images through 3 slots (images finish at different steps and later ones take the freed
    slots): tokens and every non-timing record equal batch 1's."""
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    labels = [0, 3, 5, 7, 1, 9, 4]
    cfg = DecodeConfig.of("sjd-pac", window=8, width=2, depth=3)
    one = decode(m, labels, cfg, sampling, seed=11, first_index=5)
    many = decode(m, labels, cfg, sampling, seed=11, first_index=5, batch_size=3)
    assert torch.equal(one.tokens, many.tokens)
    _same_records(one, many)
    steps = many.steps
    assert steps["active"].max() == 3 and many.method == "sjd-pac" and many.gamma == 3
    assert max(steps["batch_step"][steps["image"] == i].min() for i in range(5, 12)) > 1
    d = many.drafts
    assert set(d["depth"]) == {1, 2, 3} and d["sibling"].max() == 1
    assert (d["proposed_step"] == -1).any() and (d["proposed_step"] == d["step"] - 1).any()
    assert (steps["drafted"] <= 7).all() and steps["emitted"].sum() == 7 * 16 - 7


def test_records_and_settings():
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    cfg = DecodeConfig.of("sjd-pac", window=8, width=2, depth=3)
    assert cfg.method == "sjd-pac" and cfg.draft_depth == 3 and cfg.speculative is False
    out = decode(m, [1, 2], cfg, s, seed=3)
    assert out.settings["method"] == "sjd-pac" and out.settings["pac_width"] == 2 and out.settings["pac_window"] == 8
    d, st = out.drafts, out.steps
    for i, step in zip(st["image"], st["step"]):
        mine = (d["image"] == i) & (d["step"] == step)
        row = (st["image"] == i) & (st["step"] == step)
        assert mine.sum() == st["drafted"][row][0]
        assert d["committed"][mine].sum() == st["accepted"][row][0]
    judged = d["reached"]
    assert np.isfinite(d["accept_prob"][judged]).all() and np.isnan(d["accept_prob"][~judged]).all()
    assert (d["position"] == d["depth"] + np.repeat(st["position"], st["drafted"]) - 1).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(window=0), "--window"),
        (dict(width=0), "--pac-width"),
        (dict(depth=1.5), "--pac-depth"),
        (dict(continuation="x"), "--pac-continuation must be one of adaptive, resample"),
        (dict(window=12, width=3, depth=3), "has 13 nodes, more than --window 12; use --window 13 or more"),
    ],
)
def test_bad_knobs_raise_usage_errors(kwargs, match):
    with pytest.raises(UsageError, match=match):
        PacConfig(**kwargs)


def test_config_a_model_cannot_run():
    m = tiny(vocab=8, block=16)
    check_pac(PacConfig(window=16, width=8, depth=2), m)
    with pytest.raises(UsageError, match="--window must be <= 16, the tokens per image of tiny; got 17"):
        check_pac(PacConfig(window=17), m)
    with pytest.raises(UsageError, match="--pac-width 9 exceeds the vocabulary size 8"):
        check_pac(PacConfig(window=16, width=9, depth=2), m)
    with pytest.raises(UsageError, match="--window must be <= 16"):  # the official window: 64 tokens
        decode(m, [1], DecodeConfig.of("sjd-pac"), SamplingConfig())


def test_generate_cli(tmp_path, capsys):
    import pandas as pd

    from lantern.generate import main

    out = tmp_path / "pac"
    argv = ["--method", "sjd-pac", "--window", "16", "--pac-width", "2", "--num-images", "2", "--batch-size", "2"]
    assert main(argv + ["--out", str(out), "--no-progress"]) == 0
    steps = pd.read_parquet(out / "steps.parquet")
    assert steps["accepted"].sum() > 0 and (steps["drafted"] == 15).any()  # 2 + 4 tree drafts, 9 more on the chain
    for argv, match in (
        (["--method", "sjd-pac", "--pac-depth", "0"], "--pac-depth"),
        (["--method", "sjd", "--pac-width", "2"], "--pac-width does not apply to --method sjd, only to sjd-pac"),
        (["--method", "sjd-pac", "--jacobi-init", "random"], "--jacobi-init does not apply to --method sjd-pac"),
        (["--method", "sjd-pac", "--window", "100"], "--window must be <= 64, the tokens per image of embedded"),
    ):
        assert main(argv + ["--num-images", "1", "--out", str(tmp_path / "r"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and match in err[0], err


# --------------------------------------------------------------------------- the official verifier
def _first_token(p, q, K, D, draws, longest):
    """The first token one SJD-PAC verification commits with a context-free target ``p`` and drafts
    (K siblings without replacement from ``q`` at depths 1..D-1, one chain draft at depth D).
    ``longest``: the official rule (every node judged against its recursive residual, the longest
    accepted root-to-leaf row wins, the first in row order on ties); else recursive rejection (the
    first accepted sibling)."""
    V, cols = len(p), []
    for _ in range(1, D):
        toks, qs = [], []
        for _ in range(K):
            qs.append(sibling_q(q, toks, V, q))
            toks.append(draws.categorical(qs[-1]))
        cols.append((toks, qs))
    chain = draws.categorical(q)
    resid = []  # per depth, the residual each sibling is judged against (p: the same at every node)
    for _, qs in cols:
        resid.append([p])
        for k in range(K - 1):
            resid[-1].append(sjd_residual(resid[-1][-1], qs[k]))
    last = lambda: draws.categorical(sjd_residual(resid[0][K - 1], cols[0][1][K - 1]))
    judge = lambda d, b: draws.coin(
        float(sjd_accept_prob(resid[d - 1][b], cols[d - 1][1][b], torch.tensor(cols[d - 1][0][b])))
    )
    if not longest:
        for b in range(K):
            if judge(1, b):
                return cols[0][0][b]
        return last()
    ok = {
        digits: judge(len(digits), digits[-1]) for d in range(1, D) for digits in itertools.product(range(K), repeat=d)
    }
    chain_ok = draws.coin(float(sjd_accept_prob(p, q, torch.tensor(chain))))
    best, best_len = None, -1
    for row in itertools.product(range(K), repeat=D - 1):
        n = next((i for i in range(D - 1) if not ok[row[: i + 1]]), D - 1)
        n += n == D - 1 and not any(row) and chain_ok
        if n > best_len:
            best, best_len = row, n
    return cols[0][0][best[0]] if best_len >= 1 else last()


def _law(p, q, K, D, longest):
    got, _ = enumerate_outcomes(lambda d: _first_token(p, q, K, D, d, longest))
    out = torch.zeros(len(p), dtype=torch.float64)
    for token, prob in got.items():
        out[token] += prob
    return out


@pytest.mark.slow  # ~20 s: a few thousand enumerated verifications
def test_the_official_longest_row_verifier_is_not_lossless():
    """The official verifier keeps the longest accepted row, so a later sibling whose subtree
    accepted more wins over an earlier accepted sibling: the first committed token is no longer
    distributed as p (TVD 0.018 here, V = 4, K = 2, D = 3); the first accepted sibling (this
    implementation) gives p exactly."""
    p = torch.tensor([0.0972, 0.4959, 0.2285, 0.1784], dtype=torch.float64)
    q = torch.tensor([0.05, 0.15, 0.5, 0.3], dtype=torch.float64)
    exact, official = _law(p, q, 2, 3, False), _law(p, q, 2, 3, True)
    assert (exact - p).abs().max() < 1e-12
    assert float((official - p).abs().sum() / 2) == pytest.approx(0.01795, abs=1e-5)


def test_short_images_batch():
    """Images of 1, 2 and 5 tokens: the tree shrinks to the tokens left (none drafted at the last
    one); batch 2 gives batch 1's tokens."""
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    cfg = DecodeConfig.of("sjd-pac", window=8, width=2, depth=3)
    for N in (1, 2, 5):
        one = decode(m, [1, 2, 3, 4, 5], cfg, s, seed=2, num_tokens=N)
        many = decode(m, [1, 2, 3, 4, 5], cfg, s, seed=2, num_tokens=N, batch_size=2)
        assert torch.equal(one.tokens, many.tokens) and many.tokens.shape == (5, N)
        assert list(many.images["steps"]) == list(one.images["steps"])
        assert (many.steps["drafted"] <= 7).all() and (many.steps["position"] + many.steps["emitted"] <= N).all()
