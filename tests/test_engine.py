"""The decoding engine (lantern.engine, the methods of lantern.methods) on tiny random models.

* in float64 the engine's tokens and records, at B = 1 and B > 1, equal the one-image reference
  loops' (tests/reference) for every image, method, convention,
  greedy and sampling, CFG, temperature, top-k / top-p, with more images than slots (images
  leave and enter slots at different steps: continuous batching);
* greedy batched decoding (sd, and LANTERN rules with δ = 0) equals greedy AR token for token;
* exhaustive enumeration of the *real* batched decoder: every coin and categorical draw of one
  image branched with its probability while the other images of the batch draw from their own
  streams; with δ = 0 the image's joint distribution equals AR sampling exactly (1e-12),
  for an image that starts with the batch and for one admitted later into a freed slot;
* draft trees (EAGLE-1 static, EAGLE-2 dynamic), both conventions, every rule: the same float64
  equality of tokens and records with batch 1 (images finishing at different steps), greedy
  equality with AR, and the exact enumeration at δ = 0;
* bad input: batch size < 1, a Jacobi method, a model that cannot batch.
"""

import itertools

import numpy as np
import pytest
import torch
from reference.decode import decode_one_by_one
from reference.tree_decoding import walk_official_greedy
from reference.trees import Tree
from test_trees import TREES, enumerate_outcomes, exact_joint, tiny

from ambiguity.errors import UsageError
from ambiguity.generation import sample_tokens
from ambiguity.neighbourhood import build_neighbourhoods
from ambiguity.sampling import SamplingConfig
from lantern.drafter.model import Drafter
from lantern.engine.decode import DecodeConfig, decode
from lantern.engine.steps import Timer
from lantern.methods.tree.spec import STATIC_TREES, TreeSpec
from lantern.methods.tree.walk import Trees, walk_trees
from lantern.rules.acceptance import AcceptanceRule


@pytest.fixture(scope="module")
def model():
    return tiny(vocab=32, block=16, dim=32, std=0.5)


@pytest.fixture(scope="module")
def drafter(model):
    return Drafter.for_target(model, seed=2).eval()


@pytest.fixture(scope="module")
def table(model):
    return build_neighbourhoods(model.input_embeddings(), 8, "l2", cache=False).indices


def _same_records(a, b):
    """Every non-timing column of the steps, drafts and images tables is equal (probabilities up to
    float64 rounding: a batched product may differ from a single-row one in the last bit)."""
    for key in ("steps", "drafts", "images"):
        A, B = getattr(a, key), getattr(b, key)
        for c in A:
            if c.endswith("_s") or c in ("batch_step", "active"):
                continue
            x, y = np.asarray(A[c]), np.asarray(B[c])
            assert x.shape == y.shape, (key, c)
            if x.dtype.kind == "f":
                np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-15, err_msg=f"{key}.{c}")  # float64 rounding
            else:
                assert np.array_equal(x, y), (key, c)


CHAINS = [
    DecodeConfig.of("ar"),
    DecodeConfig.of("sd", 3),
    DecodeConfig.of("lantern", 3, k=8, delta=0.2),
    DecodeConfig.of("lantern-jsd", 2, k=8, delta=0.1),
    DecodeConfig.of("lantern++", 4, k=8, lam=2.0),
    DecodeConfig.of("lantern", 3, k=8, delta=0.2, convention="official"),
    DecodeConfig.of("sd", 3, convention="official"),
]
SAMPLINGS = [
    SamplingConfig(guidance=1.0, temperature=1.0),
    SamplingConfig(guidance=3.0, temperature=0.8, top_k=12),
    SamplingConfig(guidance=2.0, temperature=1.2, top_p=0.9),
    SamplingConfig(guidance=2.0, temperature=0.0),
]


@pytest.mark.parametrize("config", CHAINS, ids=lambda c: f"{c.method}-{c.rule.convention if c.rule else ''}")
def test_float64_batched_equals_batch_one(model, drafter, table, config):
    """7 images through 3 slots: tokens and every recorded value equal decoding one image at a time."""
    labels = [0, 3, 5, 7, 1, 9, 4]
    mixed = 0
    for s in SAMPLINGS:
        one = decode_one_by_one(model, labels, config, s, drafter, table, seed=11, first_index=5)
        many = decode(model, labels, config, s, drafter, table, seed=11, first_index=5, batch_size=3)
        assert torch.equal(one.tokens, many.tokens), s
        _same_records(one, many)
        steps = many.steps
        assert steps["active"].max() == 3 and steps["batch_step"].max() < len(steps["step"])
        assert (many.images["image"] == np.arange(5, 12)).all()
        # the slots hold images at different positions in one forward (ragged, continuous batching)
        by_batch = {}
        for b, pos in zip(steps["batch_step"], steps["position"]):
            by_batch.setdefault(b, set()).add(pos)
        mixed += sum(len(v) > 1 for v in by_batch.values())
    assert mixed > 0 or config.rule is None  # AR images advance in lockstep


def test_greedy_batched_equals_greedy_ar(model, drafter, table):
    labels = [2, 6, 8, 0, 3]
    for guidance, rule in itertools.product((1.0, 3.0), ("sd", "lantern", "lantern-jsd", "lantern++")):
        s = SamplingConfig(guidance=guidance, temperature=0.0)
        cfg = DecodeConfig.of(rule, 3, k=8, delta=0.0, lam=1.0)
        out = decode(model, labels, cfg, s, drafter, table, seed=0, batch_size=2)
        ar = torch.cat([sample_tokens(model, model.make_prompt([c], guided=s.guided), s) for c in labels])
        assert torch.equal(out.tokens, ar), (guidance, rule)


def test_decoded_tokens_are_ordinary_tensors(model, drafter, table):
    """The loop runs under inference mode; what it returns can be written and trained on."""
    out = decode(model, [1, 2], DecodeConfig.of("lantern", 3, k=8, delta=0.3), SamplingConfig(), drafter, table)
    assert not out.tokens.is_inference()
    out.tokens[0, 0] = 7  # an inference tensor refuses this outside inference mode
    assert int(out.tokens[0, 0]) == 7


def test_images_keep_their_streams_whatever_the_batch(model, drafter, table):
    """An image's tokens do not depend on the other images of the batch, its slot or when it entered."""
    s = SamplingConfig(guidance=2.0, temperature=1.0, top_k=16)
    cfg = DecodeConfig.of("lantern", 3, k=8, delta=0.3)
    full = decode(model, [1, 2, 3, 4, 5, 6], cfg, s, drafter, table, seed=4, batch_size=4)
    part = decode(model, [6, 3], cfg, s, drafter, table, seed=4, batch_size=2, indices=[5, 2])
    assert torch.equal(part.tokens, full.tokens[[5, 2]])


def test_a_draining_batch_drops_its_empty_slots(model, drafter, monkeypatch):
    """9 images through 4 slots: once the queue is empty and half the slots are free, the caches
    keep only the busy rows (CFG: two per image), and the tokens still equal batch 1's."""
    kept = []
    select = type(model).select_slots
    monkeypatch.setattr(
        type(model), "select_slots", lambda self, cache, rows: (kept.append(len(rows)), select(self, cache, rows))[1]
    )
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    for cfg in (DecodeConfig.of("sd", 3), DecodeConfig.of("ar")):
        one = decode_one_by_one(model, list(range(9)), cfg, s, drafter, seed=1)
        many = decode(model, list(range(9)), cfg, s, drafter, seed=1, batch_size=4)
        assert torch.equal(one.tokens, many.tokens)
    assert kept and all(k % 2 == 0 and k <= 4 for k in kept)


# --------------------------------------------------------------------------- draft trees
BATCH_TREES = {
    "dynamic": TreeSpec("dynamic", total_tokens=10, depth=3, top_k=3),
    "static": TreeSpec("static", STATIC_TREES["mc_sim_7b_63"], name="mc_sim_7b_63"),
}
TREE_RULES = [
    ("sd", {}),
    ("lantern", dict(k=8, delta=0.2)),
    ("lantern-jsd", dict(k=8, delta=0.1)),
    ("lantern++", dict(k=8, lam=2.0)),
]


@pytest.mark.parametrize("convention", ["exact", "official"])
@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_float64_batched_trees_equal_batch_one(model, drafter, table, kind, convention):
    """6 images through 4 slots with static and dynamic trees: tokens, steps (accepted lengths,
    kinds, drafter forwards) and every draft-tree node record equal one-image tree decoding, for
    every rule (each with two of the samplings: greedy and sampled, CFG, temperature, top-k /
    top-p). Images finish at
    different batch steps and freed slots take new images (continuous batching)."""
    labels = [0, 3, 5, 7, 1, 9]
    finish_at, accepted = set(), 0
    pairs = [(r, SAMPLINGS[(i + j) % len(SAMPLINGS)]) for i, r in enumerate(TREE_RULES) for j in (0, 1)]
    for (method, kw), s in pairs:  # every rule twice, every sampling twice
        cfg = DecodeConfig.of(method, tree=BATCH_TREES[kind], convention=convention, **kw)
        one = decode_one_by_one(model, labels, cfg, s, drafter, table, seed=7, first_index=2)
        many = decode(model, labels, cfg, s, drafter, table, seed=7, first_index=2, batch_size=4)
        assert torch.equal(one.tokens, many.tokens), (method, s)
        _same_records(one, many)
        steps = many.steps
        assert steps["active"].max() == 4 and set(steps["drafted"][steps["drafted"] > 0]) <= set(
            range(1, BATCH_TREES[kind].nodes)
        )
        last = {i: steps["batch_step"][steps["image"] == i].max() for i in np.unique(steps["image"])}
        finish_at.add(len(set(last.values())))
        accepted += int(steps["accepted"].sum())
    assert max(finish_at) > 1 and accepted > 0  # images left at different steps; trees accepted drafts


@pytest.mark.parametrize("convention", ["exact", "official"])
def test_greedy_batched_trees_equal_greedy_ar(model, drafter, table, convention):
    labels = [2, 6, 8, 0, 3]
    for kind, guidance, rule in itertools.product(BATCH_TREES, (1.0, 3.0), ("sd", "lantern")):
        s = SamplingConfig(guidance=guidance, temperature=0.0)
        cfg = DecodeConfig.of(rule, k=8, delta=0.0, convention=convention, tree=BATCH_TREES[kind])
        out = decode(model, labels, cfg, s, drafter, table, seed=0, batch_size=3)
        ar = torch.cat([sample_tokens(model, model.make_prompt([c], guided=s.guided), s) for c in labels])
        assert torch.equal(out.tokens, ar), (kind, guidance, rule)


class _FixedUniforms:
    """Stands in for the batched decoder's streams: slot b's uniforms come from ``seqs[b]`` in order,
    one for every round the slot walks; ``used[b]`` counts them."""

    def __init__(self, seqs):
        self.seqs, self.used, self.scripted = seqs, [0] * len(seqs), [None] * len(seqs)

    def each(self, mask):
        out = []
        for b, on in enumerate(mask):
            out.append(self.seqs[b][self.used[b]] if on else 0.5)
            self.used[b] += bool(on)
        return torch.tensor(out, dtype=torch.float64)


def test_batched_walk_of_two_hand_made_trees():
    """The vectorised walk (lantern.methods.tree.walk.walk_trees) on two deterministic trees (SD, V = 3)
    with fixed uniforms, all by hand. Image 0: root -> A (token 0), B (token 1); A -> C. The root
    has p = (.5, .3, .2): A is accepted with probability .5 and u = .7 rejects it; the residual
    (0, .6, .4) accepts B with u = .1; B is a leaf, so the bonus token is drawn from p at B
    (.2, .2, .6) with u = .5 -> token 2. Image 1: a chain root -> 1 -> 2 -> 0: u = .2 < .9
    accepts the first draft, u = .3 < .75 the second, u = .5 >= .4 rejects the third, and the
    residual (0, 1, 0) gives token 1 (u = .9). Image 0 walks 3 rounds, image 1 four, each
    drawing one uniform per round."""
    tokens = torch.tensor([[2, 0, 1, 2], [1, 1, 2, 0]])
    parent = torch.tensor([[0, 0, 0, 1], [0, 0, 1, 2]])
    depth = torch.tensor([[0, 1, 1, 2], [0, 1, 2, 3]])
    rank = torch.tensor([[0, 0, 1, 0], [0, 0, 0, 0]])
    exists = torch.ones(2, 4, dtype=torch.bool)
    trees = Trees(tokens, parent, depth, exists, rank, None, False, False, torch.tensor([3, 4]), 3)
    p = torch.tensor(
        [
            [[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.2, 0.2, 0.6], [1.0, 0.0, 0.0]],
            [[0.1, 0.9, 0.0], [0.0, 0.25, 0.75], [0.4, 0.6, 0.0], [1.0, 0.0, 0.0]],
        ],
        dtype=torch.float64,
    )
    streams = _FixedUniforms([[0.7, 0.1, 0.5], [0.2, 0.3, 0.5, 0.9]])
    st = type("St", (), {})()
    st.sampling, st.convention, st.device = SamplingConfig(temperature=1.0), "exact", torch.device("cpu")
    st.rule, st.table, st.streams, st.timer = AcceptanceRule("sd"), None, streams, Timer("cpu")
    active = np.array([True, True])
    out = walk_trees(st, trees, p, trees.ancestors(), active, active)
    assert out["m"].tolist() == [1, 2] and out["next"].tolist() == [2, 1]
    assert out["kind"].tolist() == [1, 2]  # NEXT_KINDS: bonus after a leaf, residual after a rejection
    assert out["path"][0, :2].tolist() == [0, 2] and out["path"][1, :3].tolist() == [0, 1, 2]
    assert streams.used == [3, 4]
    assert out["reached"].tolist() == [[False, True, True, False], [False, True, True, True]]
    assert out["accepted"].tolist() == [[False, False, True, False], [False, True, True, False]]
    np.testing.assert_allclose(out["accept_prob"][0, 1:3], [0.5, 0.6])
    np.testing.assert_allclose(out["accept_prob"][1, 1:], [0.9, 0.75, 0.4])
    np.testing.assert_allclose(out["u"][1, 1:], [0.2, 0.3, 0.5])


def test_batched_official_greedy_walk_orders_leaves_like_the_official_code():
    """The vectorised official greedy walk on two hand-made trees (V = 4): root -> a (token 0),
    b (token 1); a -> c (token 2); LANTERN k = 1, δ = 0.2, neighbours 0: 2, 1: 3, 2: 3, 3: 2.
    Image 0: at the root p = (.3, .3, .25, .15): a passes (p̃ = .3, no lower index, ties allowed)
    and b passes (p̃ = .3 + .15 = .45 > p(0)); c fails at a (p̃ = .1 + .1 < .7). Both leaves keep
    one passing node: a static tree lists leaf paths lexicographically ([0, a, c] before
    [0, b]) and keeps a (a has a child: "residual", next token argmax p(a) = 0); a dynamic tree
    lists leaves by node index (b before c) and keeps b (a leaf: "bonus", argmax p(b) = 3).
    Image 1: nothing passes at the root (p = (.1, .1, .1, .7)): no draft, token 3. Each row equals
    lantern.methods.tree.single_walk.walk_official_greedy on the same one-image tree."""
    tokens = torch.tensor([[1, 0, 1, 2], [3, 0, 1, 2]])
    parent = torch.tensor([[0, 0, 0, 1]] * 2)
    depth = torch.tensor([[0, 1, 1, 2]] * 2)
    rank = torch.tensor([[0, 0, 1, 0]] * 2)
    p = torch.tensor(
        [
            [[0.3, 0.3, 0.25, 0.15], [0.7, 0.1, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25] * 4],
            [[0.1, 0.1, 0.1, 0.7], [0.7, 0.1, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25] * 4],
        ],
        dtype=torch.float64,
    )
    table = torch.tensor([[2], [3], [3], [2]])
    rule = AcceptanceRule("lantern", k=1, delta=0.2, convention="official")
    st = type("St", (), {})()
    st.sampling, st.convention, st.device = SamplingConfig(temperature=0.0), "official", torch.device("cpu")
    st.rule, st.table, st.streams, st.timer = rule, table, None, Timer("cpu")
    active = np.array([True, True])
    want = {True: ([1, 0], [[0, 1], [0]], [0, 3], [2, 2]), False: ([1, 0], [[0, 2], [0]], [3, 3], [1, 2])}
    for static, (m, paths, nxt, kind) in want.items():
        exists = torch.ones(2, 4, dtype=torch.bool)
        trees = Trees(tokens, parent, depth, exists, rank, None, False, static, torch.tensor([2, 2]), 2)
        out = walk_trees(st, trees, p, trees.ancestors(), active, active)
        assert out["m"].tolist() == m and out["next"].tolist() == nxt and out["kind"].tolist() == kind, static
        for b in range(2):
            assert out["path"][b, : m[b] + 1].tolist() == paths[b], (static, b)
            one = Tree(tokens[b], [-1, 0, 0, 1], [0, 1, 1, 2], [[1, 2], [3], [], []], [None] * 4, static=static)
            ref = walk_official_greedy(one, p[b], rule, table)
            assert ref.path == paths[b] and ref.token == nxt[b], (static, b)
            assert sorted(t["node"] for t in ref.trials) == np.flatnonzero(out["reached"][b].numpy()).tolist()
    assert out["reached"].tolist() == [[False, True, True, False], [False, True, True, False]]  # dynamic


def test_move_slots_copies_each_rows_path_reading_before_writing(model):
    """The commit of batched trees: row r's entries at src[r] land at dst[r] in every layer, all
    read before any is written (a path node may sit where an earlier node is moved to); pairs with
    src == dst and the other slots are unchanged."""
    cache = model.new_slots_cache(3, False, 8, 4)
    kv = cache.kv
    kv.k.normal_(generator=torch.Generator().manual_seed(0))
    kv.v.copy_(-kv.k)
    k0, P = kv.k.clone(), cache.prefix
    src = torch.tensor([[3, 5], [2, 2], [4, 2]])
    dst = torch.tensor([[1, 3], [2, 2], [2, 4]])  # row 0: slot 3 is read before it is overwritten; row 2 swaps
    model.move_slots(cache, src, dst)
    want = k0.clone()
    for r in range(3):
        for s_, d_ in zip(src[r].tolist(), dst[r].tolist()):
            want[:, r, :, P + d_] = k0[:, r, :, P + s_]
    assert torch.equal(kv.k, want) and torch.equal(kv.v, -want)


# --------------------------------------------------------------------------- exact enumeration
ENUMERATED = [  # (sampling, rule, image): image 0 starts with the batch, image 2 takes a freed slot later
    (SamplingConfig(guidance=2.0, temperature=0.7, top_k=3), AcceptanceRule("lantern", k=2, delta=0.0), 2),
    (SamplingConfig(guidance=2.0, temperature=1.3, top_p=0.9), AcceptanceRule("sd"), 0),
    (SamplingConfig(guidance=1.0, temperature=1.0, top_k=2), AcceptanceRule("lantern", k=2, delta=0.0), 0),
]


@pytest.mark.slow  # ~1 min each: every branch is a full batched decode of 3 images
@pytest.mark.parametrize("sampling, rule, image", ENUMERATED)
def test_exact_batched_decoding_at_delta_zero_is_ar_sampling(sampling, rule, image):
    """Every random outcome of one image of a batched decode, weighted by its probability, gives
    exactly the AR joint (V = 4, 2 x 2 tokens, γ = 2, 3 images in 2 slots; the other images draw
    from their own streams): LANTERN δ = 0 and SD, for an image of the first batch and one
    admitted when a slot frees up (at a later batch step, next to an image at another position).
    Some steps accept drafts and some reject them."""
    m = tiny()
    d = Drafter.for_target(m, seed=3).eval()
    nb = build_neighbourhoods(m.input_embeddings(), 2, "l2", cache=False).indices
    want = exact_joint(m, 1, sampling)
    seen = {"accepted": 0, "rejected": 0, "late": 0}

    def run(draws):
        out = decode(m, [1, 2, 1], DecodeConfig(rule, 2), sampling, d, nb, seed=9, batch_size=2, draws={image: draws})
        mine = out.steps["image"] == image
        seen["accepted"] += int(out.steps["accepted"][mine].sum())
        seen["rejected"] += int((out.drafts["reached"] & ~out.drafts["accepted"])[out.drafts["image"] == image].sum())
        seen["late"] += int(out.steps["batch_step"][mine].min() > 1)
        return tuple(out.tokens[image].tolist())

    got, runs = enumerate_outcomes(run)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    assert set(got) <= set(want) and runs > 10
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), seq
    assert seen["accepted"] > 0 and seen["rejected"] > 0 and (seen["late"] > 0) == (image == 2)


TREE_ENUMERATED = [  # (tree, sampling, rule, image)
    ("dynamic", SamplingConfig(guidance=2.0, temperature=0.7, top_k=3), AcceptanceRule("lantern", k=2, delta=0.0), 2),
    ("dynamic", SamplingConfig(guidance=1.0, temperature=1.0), AcceptanceRule("sd"), 0),
    ("static", SamplingConfig(guidance=2.0, temperature=1.0, top_k=3), AcceptanceRule("lantern", k=2, delta=0.0), 2),
    ("static", SamplingConfig(guidance=1.0, temperature=1.3, top_p=0.9), AcceptanceRule("sd"), 0),
]


@pytest.mark.slow  # ~1-3 min each: every branch is a full batched tree decode of 3 images
@pytest.mark.parametrize("tree, sampling, rule, image", TREE_ENUMERATED)
def test_exact_batched_tree_decoding_at_delta_zero_is_ar_sampling(tree, sampling, rule, image):
    """The enumeration above with draft trees (V = 4, 2 x 2 tokens, the trees of test_trees, 3
    images in 2 slots): every coin and categorical draw of one image (tree drafting without
    replacement, sibling trials, residual and bonus tokens) branched with its probability gives
    exactly the AR joint, for an image of the first batch and one admitted later."""
    m = tiny()
    d = Drafter.for_target(m, seed=3).eval()
    nb = build_neighbourhoods(m.input_embeddings(), 2, "l2", cache=False).indices
    want = exact_joint(m, 1, sampling)
    seen = {"accepted": 0, "rejected": 0, "late": 0}

    def run(draws):
        out = decode(
            m,
            [1, 2, 1],
            DecodeConfig(rule, tree=TREES[tree]),
            sampling,
            d,
            nb,
            seed=9,
            batch_size=2,
            draws={image: draws},
        )
        mine = out.steps["image"] == image
        seen["accepted"] += int(out.steps["accepted"][mine].sum())
        seen["rejected"] += int((out.drafts["reached"] & ~out.drafts["accepted"])[out.drafts["image"] == image].sum())
        seen["late"] += int(out.steps["batch_step"][mine].min() > 1)
        return tuple(out.tokens[image].tolist())

    got, runs = enumerate_outcomes(run)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    assert set(got) <= set(want) and runs > 10
    for seq, prob in want.items():
        assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), seq
    assert seen["accepted"] > 0 and seen["rejected"] > 0 and (seen["late"] > 0) == (image == 2)


@pytest.mark.slow
def test_relaxed_batched_decoding_is_not_ar_sampling():
    """Power check: the same enumeration with δ = 0.4 moves the joint away from AR."""
    m = tiny()
    d = Drafter.for_target(m, seed=3).eval()
    nb = build_neighbourhoods(m.input_embeddings(), 2, "l2", cache=False).indices
    s = SamplingConfig(guidance=1.0, temperature=1.0, top_k=2)
    want = exact_joint(m, 1, s)
    rule = AcceptanceRule("lantern", k=2, delta=0.4)
    got, _ = enumerate_outcomes(
        lambda dr: tuple(
            decode(m, [1, 1], DecodeConfig(rule, 2), s, d, nb, batch_size=2, draws={0: dr}).tokens[0].tolist()
        )
    )
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-9)
    assert max(abs(got.get(k, 0.0) - v) for k, v in want.items()) > 1e-3


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_float64_batched_equals_batch_one_on_cuda():
    """The same exactness on a GPU: per-image CUDA generators, in-place cache writes, masks, the
    tree path moves of batched draft trees."""
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    m.gpt.cuda()
    m.device, m.image_token_ids = torch.device("cuda"), m.image_token_ids.cuda()
    d = Drafter.for_target(m, seed=2).eval()
    s = SamplingConfig(guidance=2.0, temperature=1.0, top_k=12)
    trees = [DecodeConfig.of("sd", tree=BATCH_TREES[kind]) for kind in ("dynamic", "static")]
    for cfg in (DecodeConfig.of("ar"), DecodeConfig.of("sd", 3), *trees):
        one = decode_one_by_one(m, [0, 3, 5, 7, 1], cfg, s, d, seed=3)
        many = decode(m, [0, 3, 5, 7, 1], cfg, s, d, seed=3, batch_size=2)
        assert torch.equal(one.tokens, many.tokens)


# --------------------------------------------------------------------------- bad input
def test_bad_batched_calls_raise_usage_errors(model, drafter, table, monkeypatch):
    s = SamplingConfig(guidance=1.0, temperature=1.0)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(UsageError, match="--batch-size"):
            decode(model, [1, 2], DecodeConfig.of("ar"), s, batch_size=bad)

    class NoBatch(type(model)):
        can_batch_decode = False

    monkeypatch.setattr("ambiguity.memory.available_bytes", lambda device=None: 3 * 10**5)
    with pytest.raises(UsageError, match=r"--batch-size 6 needs about .* use --batch-size \d+ or less"):
        decode(model, list(range(6)), DecodeConfig.of("sd", 3), s, drafter, batch_size=6)
    monkeypatch.undo()
    plain = NoBatch.__new__(NoBatch)
    plain.__dict__.update(model.__dict__)
    for B in (1, 2):  # batch 1 runs on the slot engine too
        with pytest.raises(UsageError, match="cannot decode on the slot engine: .*per-image cache positions"):
            decode(plain, [1, 2], DecodeConfig.of("ar"), s, batch_size=B)
