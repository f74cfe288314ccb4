"""LANTERN decoding (lantern/engine/decode.py, lantern/engine/records.py) on tiny random models.

* greedy speculative decoding (sd, and lantern with δ = 0) reproduces greedy AR tokens exactly,
  with partial acceptances so that KV-cache rollback of target and drafter is exercised; also
  on the shipped embedded model when its weights are present;
* with sampling and δ = 0 the joint distribution of the tokens equals AR sampling: chi-square
  tests against the *exact* AR distribution, enumerated by teacher forcing (V = 8, 4 tokens);
* the drafter sees the true target features (EAGLE alignment) and the recorded p(x̂) are the
  target's, checked against teacher-forced passes;
* record identities, hand-computed acceptance, LANTERN >= SD on the same random numbers,
  bad parameters.
"""

import itertools
import math

import numpy as np
import pytest
import torch
from reference.cache import OneImageCache
from reference.chain import autoregressive_decode, speculative_decode

from ambiguity.errors import UsageError
from ambiguity.generation import sample_tokens
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.llamagen import LlamaGenModel
from ambiguity.models.vq import VQConfig, VQModel
from ambiguity.neighbourhood import build_neighbourhoods
from ambiguity.sampling import SamplingConfig, distribution
from ambiguity.seeding import image_seed
from lantern.drafter.model import Drafter, target_fingerprint
from lantern.engine.decode import DecodeConfig, check_drafter, decode, neighbour_table
from lantern.engine.records import accept_histogram
from lantern.methods.chain import accept
from lantern.rules.acceptance import AcceptanceRule


def tiny_model(vocab=64, block=16, seed=0, head_std=0.3, vq=False, name="tiny"):
    torch.manual_seed(seed)
    gpt = GPT(
        GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=vocab, block_size=block, num_classes=10, multiple_of=32)
    )
    torch.nn.init.normal_(gpt.output.weight, 0.0, head_std)  # the official init zeroes the head
    tok = None
    if vq:
        tok = VQModel(
            VQConfig(
                codebook_size=vocab,
                codebook_embed_dim=4,
                encoder_ch_mult=[1, 2],
                decoder_ch_mult=[1, 2],
                z_channels=32,
                ch=32,
                num_res_blocks=1,
                in_channels=1,
            )
        )
    return LlamaGenModel(gpt.eval(), tok, name=name)


class CopyDrafter:
    """A drafter that runs the target itself (its own KV cache holds the same positions as a
    real drafter's) and perturbs the head: q = softmax(head(h) + noise * h R). With noise 0 its
    q equals p; with noise > 0 greedy drafts are sometimes wrong (partial acceptances)."""

    def __init__(self, model, prompt, noise=0.0, seed=0):
        self.model, self.prompt, self.noise = model, prompt, noise
        g = torch.Generator().manual_seed(seed)
        self.R = torch.randn(model.hidden_size, model.vocab_size, generator=g)
        self.target = target_fingerprint(model)

    def new_cache(self, rows):
        cache = OneImageCache(self.model, self.prompt, self.model.num_tokens)
        cache.prefill()
        return cache

    def rollback(self, cache, n):
        cache.rollback(n)

    def __call__(self, model, tokens, features, cache, start):
        if cache.n != start:
            cache.rollback(start)
        return cache.extend(tokens).hidden

    def logits(self, model, f):
        return model.head(f) + self.noise * (f.float() @ self.R)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads; on shared busy cores two threads spin (8x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def drafter(model):
    return Drafter.for_target(model, seed=1).eval()


@pytest.fixture(scope="module")
def table(model):
    return build_neighbourhoods(model.input_embeddings(), 16, "l2", cache=False).indices


# --------------------------------------------------------------------------- greedy exactness
def _greedy_matches_ar(model, drafter_for, rules, gammas, cfgs, labels):
    partial = 0
    for cfg, label in itertools.product(cfgs, labels):
        s = SamplingConfig(guidance=cfg, temperature=0.0)
        prompt = model.make_prompt([label], guided=s.guided)
        ar = sample_tokens(model, prompt, s)
        for (rule, nb), gamma in itertools.product(rules, gammas):
            out = speculative_decode(model, drafter_for(prompt), prompt, s, rule, nb, gamma)
            assert torch.equal(out.tokens, ar), (cfg, label, rule.method, gamma)
            acc = out.steps["accepted"]
            partial += int(((acc > 0) & (acc < out.steps["drafted"])).sum())
    return partial


def test_greedy_speculative_equals_greedy_autoregressive(model, table):
    rules = [
        (AcceptanceRule("sd"), None),
        (AcceptanceRule("lantern", k=16, delta=0.0), table),
        (AcceptanceRule("lantern-jsd", k=16, delta=0.0), table),
        (AcceptanceRule("lantern++", k=16, lam=1.0), table),
    ]
    partial = _greedy_matches_ar(
        model, lambda pr: CopyDrafter(model, pr, noise=0.15), rules, (1, 3, 5), (1.0, 3.0), (0, 7)
    )
    assert partial >= 5  # some chains were cut mid-way: rollback of both caches was exercised


def test_greedy_with_a_real_drafter_equals_autoregressive(model, drafter):
    # a perfect drafter accepts whole chains (bonus tokens); the EAGLE drafter mostly rejects
    s = SamplingConfig(guidance=2.0, temperature=0.0)
    prompt = model.make_prompt([4], guided=True)
    ar = sample_tokens(model, prompt, s)
    for d in (drafter, CopyDrafter(model, prompt, noise=0.0)):
        out = speculative_decode(model, d, prompt, s, AcceptanceRule("sd"), None, 4)
        assert torch.equal(out.tokens, ar)
    assert out.steps["accepted"].tolist() == [4, 4, 4]  # 1 + 5 + 5 + 5 = 16 tokens


def _shipped_embedded():
    from ambiguity.models.embedded import GPT_FILE, VQ_FILE, WEIGHTS_DIR

    if not ((WEIGHTS_DIR / GPT_FILE).is_file() and (WEIGHTS_DIR / VQ_FILE).is_file()):
        pytest.skip("embedded weights not in ambiguity/weights/ yet")
    from ambiguity.models.embedded import load_embedded
    from lantern.drafter.model import load_drafter, shipped_drafter_path

    m = load_embedded()
    trained = shipped_drafter_path(m.name).is_file()
    return m, (load_drafter(m) if trained else Drafter.for_target(m, seed=0).eval()), trained


def test_greedy_on_the_embedded_model_equals_autoregressive():
    m, d, trained = _shipped_embedded()
    cfg = DecodeConfig.of("lantern", 4, k=8, delta=0.0)
    partial = 0
    nb = neighbour_table(m, cfg, cache=False)
    for label, scale, rules in ((0, 4.0, ((AcceptanceRule("sd"), None), (cfg.rule, nb))), (5, 1.0, ((cfg.rule, nb),))):
        s = SamplingConfig(guidance=scale, temperature=0.0)
        prompt = m.make_prompt([label], guided=s.guided)
        ar = sample_tokens(m, prompt, s)
        for rule, table in rules:
            out = speculative_decode(m, d, prompt, s, rule, table, 4)
            assert torch.equal(out.tokens, ar), (label, rule.method)
            acc = out.steps["accepted"]
            partial += int(((acc > 0) & (acc < out.steps["drafted"])).sum())
    assert partial > 0 or not trained  # the shipped drafter gets chains cut mid-way: rollback exercised


# --------------------------------------------------------------------------- exact distribution
V8, N4 = 8, 4


def _exact_ar_joint(model, label, s):
    """P(x_0..x_3) (8, 8, 8, 8) of AR sampling, by teacher forcing all 8^3 prefixes."""
    prefixes = torch.tensor(list(itertools.product(range(V8), repeat=N4 - 1)))
    tokens = torch.cat([prefixes, torch.zeros(len(prefixes), 1, dtype=torch.long)], 1)
    prompt = model.make_prompt([label] * len(prefixes), guided=s.guided)
    with torch.no_grad():
        logits = model.teacher_force(prompt, torch.cat([tokens, tokens]) if s.guided else tokens).logits
    p = distribution(logits, s, s.guided).double()  # (512, 4, 8)
    joint = p[0, 0]  # p(x_0), the same in every row
    for t in range(1, N4):
        cond = p[:, t].view(*(V8,) * (N4 - 1), V8)  # p(x_t | x_<t) indexed by (x_0, x_1, x_2)
        idx = [slice(None)] * t + [0] * (N4 - 1 - t)
        joint = joint.unsqueeze(-1) * cond[tuple(idx)]
    return joint


def _chi2_pvalue(counts, probs):
    """Chi-square goodness of fit; cells with expected count < 5 are pooled into one."""
    from scipy.stats import chisquare

    n = counts.sum()
    exp = probs * n
    small = exp < 5
    obs_c = np.append(counts[~small], counts[small].sum())
    exp_c = np.append(exp[~small], exp[small].sum())
    keep = exp_c > 0
    return chisquare(obs_c[keep], exp_c[keep] * obs_c[keep].sum() / exp_c[keep].sum()).pvalue


def _sample_sd(model, drafter, s, rule, table, runs, label=3, gamma=2):
    prompt = model.make_prompt([label], guided=s.guided)
    out = np.empty((runs, N4), dtype=np.int64)
    accepted = 0
    for i in range(runs):
        d = speculative_decode(model, drafter, prompt, s, rule, table, gamma, torch.Generator().manual_seed(i))
        out[i] = d.tokens[0].numpy()
        accepted += int(d.steps["accepted"].sum())
    return out, accepted


def _pvalues(samples, joint):
    """Marginal of each position and the joint of each adjacent pair against the exact joint."""
    j = joint.numpy()
    pv = []
    for t in range(N4):
        probs = j.sum(axis=tuple(a for a in range(N4) if a != t))
        pv.append(_chi2_pvalue(np.bincount(samples[:, t], minlength=V8), probs))
    for t in range(N4 - 1):
        probs = j.sum(axis=tuple(a for a in range(N4) if a not in (t, t + 1))).reshape(-1)
        pv.append(_chi2_pvalue(np.bincount(samples[:, t] * V8 + samples[:, t + 1], minlength=V8 * V8), probs))
    return pv


@pytest.mark.slow
def test_sampling_with_delta_zero_matches_autoregressive_distribution():
    """2000 seeded LANTERN(δ = 0) runs vs the exact AR joint (V = 8, 2 x 2 tokens, CFG 2, γ = 2,
    a drafter close to the target so that whole chains, cut chains and residuals all occur):
    7 chi-square tests (each position, each adjacent pair) each at p > 1e-3 (Bonferroni: a
    correct decoder fails with probability < 1 %; seeds are fixed, so the outcome is
    deterministic). SD draws the very same tokens. Power check: LANTERN with δ = 0.3 (lossy),
    fails the same tests (p < 1e-6) with 1000 runs."""
    torch.manual_seed(2)
    gpt = GPT(GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=V8, block_size=N4, num_classes=10, multiple_of=32))
    torch.nn.init.normal_(gpt.output.weight, 0.0, 0.5)
    m = LlamaGenModel(gpt.eval(), None, name="tiny")
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    d = CopyDrafter(m, m.make_prompt([3], guided=True), noise=0.3)
    nb = build_neighbourhoods(m.input_embeddings(), 3, "l2", cache=False).indices
    joint = _exact_ar_joint(m, 3, s)
    assert float(joint.sum()) == pytest.approx(1.0, abs=1e-6)
    samples, accepted = _sample_sd(m, d, s, AcceptanceRule("lantern", k=3, delta=0.0), nb, 2000)
    assert accepted > 2000  # > 1 accepted draft per image on average; 3 tokens can be drafted per image
    assert min(_pvalues(samples, joint)) > 1e-3
    sd, _ = _sample_sd(m, d, s, AcceptanceRule("sd"), None, 200)
    assert np.array_equal(sd, samples[:200])
    lossy, _ = _sample_sd(m, d, s, AcceptanceRule("lantern", k=3, delta=0.3), nb, 1000)
    assert min(_pvalues(lossy, joint)) < 1e-6


def test_autoregressive_decode_equals_sample_tokens(model):
    s = SamplingConfig(guidance=3.0, temperature=1.0, top_k=20)
    prompt = model.make_prompt([2], guided=True)
    ref = sample_tokens(model, prompt, s, torch.Generator().manual_seed(5))
    out = autoregressive_decode(model, prompt, s, torch.Generator().manual_seed(5))
    assert torch.equal(out.tokens, ref)
    assert out.summary()["tokens_per_forward"] == 1.0 and out.summary()["tau"] == 1.0


# --------------------------------------------------------------------------- EAGLE alignment
def test_drafter_and_target_see_the_committed_prefix(model, drafter, table):
    """q(x̂) of every chain's first draft = the drafter run teacher-forced with true target
    features over the final tokens; p(x̂) of every reached draft = the teacher-forced target."""
    s = SamplingConfig(guidance=2.0, temperature=1.0, top_p=0.95)
    prompt = model.make_prompt([6], guided=True)
    cut = 0
    for seed, rule in (
        (0, AcceptanceRule("lantern", k=16, delta=0.05)),
        (1, AcceptanceRule("sd")),
        (2, AcceptanceRule("lantern", k=16, delta=0.3)),
    ):
        out = speculative_decode(model, drafter, prompt, s, rule, table, 3, torch.Generator().manual_seed(seed))
        cut += int((out.steps["accepted"] < out.steps["drafted"]).sum())
        toks = torch.cat([out.tokens, out.tokens])
        with torch.no_grad():
            tf = model.teacher_force(prompt, toks)
            pred = drafter(model, toks[:, :-1], tf.hidden[:, :-1], None, 0)
            q_tf = distribution(drafter.logits(model, pred), s, True)[0]  # (N-1, V): row i predicts x_{i+1}
            p_tf = distribution(tf.logits, s, True)[0]  # (N, V): row i predicts x_i
        dr = out.drafts
        first = dr["draft_index"] == 0
        pos, tok = dr["position"][first], dr["token"][first]
        np.testing.assert_allclose(dr["q_draft"][first], q_tf[pos - 1, tok].numpy(), rtol=1e-4, atol=1e-6)
        reached = dr["reached"]
        pos, tok = dr["position"][reached], dr["token"][reached]
        np.testing.assert_allclose(dr["p_draft"][reached], p_tf[pos, tok].numpy(), rtol=1e-4, atol=1e-6)
        committed = dr["committed"]
        assert np.array_equal(dr["token"][committed], out.tokens[0, dr["position"][committed]].numpy())
        assert (dr["p_tilde"] >= dr["p_draft"] - 1e-7).all()
        assert (dr["spent"][dr["j_star"] > 0] <= rule.delta + 1e-6).all()
    assert cut >= 3  # chains were cut, so features after a rejection were exercised


# --------------------------------------------------------------------------- records
def test_record_identities(model, drafter, table):
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    cfg = DecodeConfig.of("lantern", 3, k=16, delta=0.2)
    out = decode(model, [0, 1, 2, 3], cfg, s, drafter, table, seed=7)
    steps, drafts, images = out.frames()
    N = model.num_tokens
    assert out.tokens.shape == (4, N) and images["tokens"].tolist() == [N] * 4
    per_img = steps.groupby("image")
    assert (per_img["emitted"].sum() + 1 == N).all()  # prefill token + accepted + 1 per step
    assert (per_img["accepted"].sum().values == images["accepted"].values).all()
    assert (images["target_forwards"] == 1 + images["steps"]).all()
    assert (steps["drafted"] == np.minimum(3, N - 1 - steps["position"])).all()
    by_step = drafts.groupby(["image", "step"])
    merged = steps.set_index(["image", "step"]).join(by_step[["committed", "reached"]].sum())
    chained = merged[merged["drafted"] > 0]
    assert (chained["committed"] == chained["accepted"]).all()
    assert (chained["reached"] == np.minimum(chained["accepted"] + 1, chained["drafted"])).all()
    assert set(steps["next_kind"]) <= {"bonus", "residual", "target"}
    assert ((steps["next_kind"] == "bonus") == ((steps["accepted"] == steps["drafted"]) & (steps["drafted"] > 0))).all()
    summ = out.summary()
    hist = summ["accept_histogram"]
    assert len(hist) == 4 and sum(hist) == len(steps) == summ["steps"]
    assert sum(j * c for j, c in enumerate(hist)) == steps["accepted"].sum()
    assert summ["tau"] == pytest.approx(summ["mean_accepted_drafts"] + 1)
    assert summ["tau"] == pytest.approx((summ["tokens"] - 4) / summ["steps"])
    assert summ["tokens_per_forward"] == pytest.approx(4 * N / (4 + summ["steps"]))
    assert summ["acceptance_rate"] == pytest.approx(drafts["committed"].sum() / drafts["reached"].sum())
    for col in ("target_s", "drafter_s", "acceptance_s"):
        assert (steps[col] >= 0).all() and images[col].sum() > 0
    assert (images["total_s"] >= images[["target_s", "drafter_s", "acceptance_s"]].sum(axis=1) - 1e-9).all()
    assert images["seed"].tolist() == [image_seed(7, i) for i in range(4)]
    # the same image index gives the same tokens when decoded alone (per-image seeds: resumable runs)
    alone = decode(model, [2], cfg, s, drafter, table, seed=7, first_index=2)
    assert torch.equal(alone.tokens[0], out.tokens[2])


def test_accept_hand_case():
    """Draft 0 is always accepted (p/q = 2); draft 1 with probability 1/4; its residual
    norm(max(p - q, 0)) is one-hot at 2, the bonus one-hot at 3."""
    p = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.0, 0.25, 0.75, 0.0], [0.0, 0.0, 0.0, 1.0]]])
    q = torch.tensor([[[0.25, 0.75, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]])
    drafts = torch.tensor([[0, 1]])
    g = torch.Generator().manual_seed(0)
    counts = {1: 0, 2: 0}
    for _ in range(4000):
        r = accept(p, q, drafts, AcceptanceRule("sd"), None, False, g)
        a = int(r.accepted[0])
        counts[a] += 1
        assert int(r.next_token[0]) == {1: 2, 2: 3}[a] and int(r.next_kind[0]) == {1: 2, 2: 1}[a]
        assert r.verdict.accepted[0, 0] and r.verdict.accept_prob[0, 1] == 0.25
    assert counts[2] / 4000 == pytest.approx(0.25, abs=4 * math.sqrt(0.25 * 0.75 / 4000))
    q0 = torch.tensor([[[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]]])  # p(3) = 0: the first draft always fails
    for _ in range(50):
        r = accept(p, q0, torch.tensor([[3, 1]]), AcceptanceRule("sd"), None, False, g)
        assert int(r.accepted[0]) == 0 and int(r.next_token[0]) in (0, 1)  # residual of position 0
    greedy = accept(p, q, drafts, AcceptanceRule("sd"), None, True)
    assert int(greedy.accepted[0]) == 1 and int(greedy.next_token[0]) == 2  # 0 ties 1 (accepted); 1 < 2
    none = accept(p[:, :1], q[:, :0], drafts[:, :0], AcceptanceRule("sd"), None, True)
    assert int(none.accepted[0]) == 0 and int(none.next_token[0]) == 0 and none.verdict is None


def test_lantern_accepts_at_least_as_often_as_sd_on_the_same_random_numbers(model, drafter, table):
    """The first verification step sees identical p, q, drafts and u for both rules; p̃ >= p,
    so LANTERN's accepted prefix is never shorter."""
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    prompt = model.make_prompt([1], guided=True)
    sd_first, la_first, sd_all, la_all = [], [], [], []
    for seed in range(30):
        sd = speculative_decode(
            model, drafter, prompt, s, AcceptanceRule("sd"), None, 4, torch.Generator().manual_seed(seed)
        )
        la = speculative_decode(
            model,
            drafter,
            prompt,
            s,
            AcceptanceRule("lantern", k=16, delta=0.4),
            table,
            4,
            torch.Generator().manual_seed(seed),
        )
        assert np.array_equal(sd.drafts["token"][:4], la.drafts["token"][:4])
        assert np.array_equal(sd.drafts["u"][:4], la.drafts["u"][:4])
        sd_first.append(sd.steps["accepted"][0])
        la_first.append(la.steps["accepted"][0])
        sd_all.append(sd.summary()["acceptance_rate"])
        la_all.append(la.summary()["acceptance_rate"])
    assert all(b >= a for a, b in zip(sd_first, la_first)) and sum(la_first) > sum(sd_first)
    assert np.mean(la_all) > np.mean(sd_all)


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="lantern", delta=-0.1), r"AcceptanceRule.delta must be >= 0"),
        (dict(method="lantern++", lam=0.5), r"AcceptanceRule.lam must be >= 1"),
        (dict(method="lantern", gamma=0), "gamma"),
        (dict(method="medusa"), "unknown method"),
        (dict(method="lantern", metric="manhattan"), "DecodeConfig.metric"),
    ],
)
def test_bad_settings_raise_usage_errors(kwargs, match):
    with pytest.raises(UsageError, match=match):
        DecodeConfig.of(**kwargs)


def test_bad_decode_calls_raise_usage_errors(model, drafter):
    s = SamplingConfig(guidance=1.0, temperature=1.0)
    with pytest.raises(UsageError, match="smaller than the vocabulary size"):
        neighbour_table(tiny_model(vq=True), DecodeConfig.of("lantern", k=64))
    with pytest.raises(UsageError, match="needs the VQ codebook of tiny"):
        neighbour_table(model, DecodeConfig.of("lantern", k=8))
    with pytest.raises(UsageError, match="one condition at a time"):
        speculative_decode(model, drafter, model.make_prompt([1, 2]), s, AcceptanceRule("sd"))
    with pytest.raises(UsageError, match="needs a drafter"):
        decode(model, [1], DecodeConfig.of("sd"), s)
    other = Drafter.for_target(tiny_model(seed=5), seed=0)
    with pytest.raises(UsageError, match="drafter was built for tiny with other weights"):
        check_drafter(other, model)
    with pytest.raises(UsageError, match="guidance rows"):
        speculative_decode(model, drafter, model.make_prompt([1], guided=True), s, AcceptanceRule("sd"))


def test_decode_with_codebook_neighbours_and_pixels(tmp_path, monkeypatch):
    monkeypatch.setenv("AMBIGUITY_NEIGHBOURHOOD_CACHE", str(tmp_path))
    m = tiny_model(vq=True)
    d = Drafter.for_target(m, seed=1).eval()
    s = SamplingConfig(guidance=1.0, temperature=1.0, top_k=32)
    for cfg in (
        DecodeConfig.of("lantern-jsd", 2, k=8, delta=0.1),
        DecodeConfig.of("lantern", 2, k=8, delta=0.1, convention="official"),
    ):
        out = decode(m, [0, 9], cfg, s, d, seed=1, pixels=True)
        assert out.pixels.shape == (2, 1, 8, 8) and 0 <= float(out.pixels.min()) <= float(out.pixels.max()) <= 1
        assert (out.drafts["j_star"] <= 8).all() and out.summary()["method"] == cfg.method
    assert accept_histogram({"accepted": np.array([0, 2, 2])}, 2) == [1, 0, 2]
