"""Draft trees (lantern.methods.tree.single, lantern.methods.tree.single_walk) on tiny random models.

* tree attention: the target's logits at every node equal a chain forward over the node's path,
  and the cache kept after :meth:`keep_path` equals the cache of that chain (LlamaGen GPT and a
  transformers adapter);
* exhaustive enumeration of the *real* tree decoder (every coin and categorical draw branched,
  with its probability): with the ``exact`` convention and δ = 0 the joint distribution of an
  image's tokens equals autoregressive sampling exactly (1e-9), for dynamic and static trees,
  with guidance, temperature, top-k and top-p;
* greedy tree decoding with δ = 0 equals greedy AR token for token (both conventions);
* the ``official`` convention reproduces hand-computed verdicts of the official code;
* dynamic trees keep the best candidates by cumulative drafter log-probability; bad specs.
"""

import itertools
import math
from collections import defaultdict

import pytest
import torch
from reference.cache import OneImageCache
from reference.tree_decoding import tree_decode, walk_official_greedy, walk_tree
from reference.trees import Tree

from ambiguity.errors import UsageError
from ambiguity.generation import sample_tokens
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.llamagen import LlamaGenModel
from ambiguity.neighbourhood import build_neighbourhoods
from ambiguity.sampling import SamplingConfig, distribution, expand_rows
from lantern.distortion import sibling_output_distribution
from lantern.drafter.model import Drafter
from lantern.engine.decode import DecodeConfig, decode
from lantern.methods.tree.draft import log_q, top_log_q
from lantern.methods.tree.spec import STATIC_TREES, TreeSpec, check_paths, parse_tree
from lantern.rules.acceptance import AcceptanceRule


def tiny(vocab=4, block=4, seed=0, std=0.8, dim=16, dtype=torch.float64):
    """A one-layer LlamaGen GPT; float64 so that tree, chain and teacher-forced forwards agree to ~1e-15."""
    torch.manual_seed(seed)
    gpt = GPT(
        GPTConfig(dim=dim, n_layer=1, n_head=2, vocab_size=vocab, block_size=block, num_classes=10, multiple_of=16)
    )
    torch.nn.init.normal_(gpt.output.weight, 0.0, std)
    return LlamaGenModel(gpt.to(dtype).eval(), name="tiny")


# --------------------------------------------------------------------------- specs
def test_static_tree_shapes_and_validation(tmp_path):
    assert len(STATIC_TREES["mc_sim_7b_63"]) == 25 and len(STATIC_TREES["naive_extend_57"]) == 57
    assert len(STATIC_TREES["medusa_2_7b_63"]) == 63 and TreeSpec("static", STATIC_TREES["chain"]).max_depth == 5
    for name, paths in STATIC_TREES.items():
        assert check_paths(paths) == tuple(sorted(paths, key=lambda p: (len(p), p))), name
    for bad, msg in (
        ([[0, 0]], "no parent"),
        ([[0], [0]], "twice"),
        ([[1]], "elder sibling"),
        ([[]], "empty"),
        ([], "no paths"),
        ([["a"]], "list of paths"),
    ):
        with pytest.raises(UsageError, match=msg):
            check_paths(bad)
    for kw, field in ((dict(total_tokens=1), "total_tokens"), (dict(depth=0), "depth"), (dict(top_k=0), "top_k")):
        with pytest.raises(UsageError, match=f"TreeSpec.{field} must be an integer"):  # the CLI names its flag
            TreeSpec("dynamic", **kw)
    assert parse_tree("chain") is None and parse_tree("dynamic", 20, 2, 3) == TreeSpec(
        "dynamic", total_tokens=20, depth=2, top_k=3
    )
    f = tmp_path / "t.json"
    f.write_text("[[0], [1], [0, 0]]")
    assert parse_tree(str(f)).paths == ((0,), (1,), (0, 0))
    with pytest.raises(UsageError, match="unknown --tree 'bushy'; use chain, dynamic, one of mc_sim_7b_63"):
        parse_tree("bushy")
    for missing in (str(tmp_path / "none.json"), str(tmp_path / "none"), "none.json"):
        with pytest.raises(UsageError, match=f"^--tree {missing} does not exist; give a .json file"):
            parse_tree(missing)
    m = tiny()
    with pytest.raises(UsageError, match="drafts 5 deep but an image of tiny has 4 tokens"):
        decode(
            m,
            [0],
            DecodeConfig.of("sd", tree=TreeSpec("dynamic", depth=4)),
            SamplingConfig(),
            Drafter.for_target(m, seed=0),
        )


# --------------------------------------------------------------------------- tree attention
def _random_tree(T, gen):
    parents = [-1] + [int(torch.randint(0, t, (1,), generator=gen)) for t in range(1, T)]
    depths = [0]
    for t in range(1, T):
        depths.append(depths[parents[t]] + 1)
    return parents, depths


def _check_tree_attention(model, prompt, n, guided, gen):
    """Logits of every node of a random tree == the chain forward over its root-to-node path."""
    V = model.vocab_size
    prefix = torch.randint(0, V, (1, n), generator=gen)
    parents, depths = _random_tree(6, gen)
    while max(depths) > model.num_tokens - n:
        parents, depths = _random_tree(6, gen)
    toks = torch.cat([prefix[:, -1:], torch.randint(0, V, (1, 5), generator=gen)], 1)
    tree = Tree(toks[0], parents, depths)
    cache = OneImageCache(model, prompt, model.num_tokens, 8)
    cache.prefill()
    if n > 1:
        cache.extend(expand_rows(prefix[:, :-1], guided))
    out = cache.extend_tree(expand_rows(toks, guided), torch.tensor(depths), tree.ancestors())
    for t in range(6):
        path = tree.path_to(t)
        ref_cache = OneImageCache(model, prompt, model.num_tokens)
        ref_cache.prefill()
        chain = torch.cat([prefix[:, :-1], toks[:, path]], 1)
        ref = ref_cache.extend(expand_rows(chain, guided))
        torch.testing.assert_close(out.logits[:, t], ref.logits[:, -1], atol=1e-4, rtol=1e-4)
    # keep the path to node 5: the cache now equals that chain's cache (next logits agree)
    path = tree.path_to(5)
    cache.keep_path(n - 1, torch.tensor(path))
    assert cache.n == n - 1 + len(path)
    nxt = torch.randint(0, V, (1, 1), generator=gen)
    if n - 1 + len(path) < model.num_tokens:
        a = cache.extend(expand_rows(nxt, guided))
        ref_cache = OneImageCache(model, prompt, model.num_tokens)
        ref_cache.prefill()
        b = ref_cache.extend(expand_rows(torch.cat([prefix[:, :-1], toks[:, path], nxt], 1), guided))
        torch.testing.assert_close(a.logits[:, -1], b.logits[:, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("guided", [False, True])
def test_llamagen_tree_attention_equals_chains(guided):
    m = tiny(vocab=16, block=16, dim=32)
    gen = torch.Generator().manual_seed(0)
    prompt = m.make_prompt([3], guided=guided)
    for n in (1, 3, 6):
        with torch.no_grad():
            _check_tree_attention(m, prompt, n, guided, gen)


def test_transformers_adapter_tree_attention_equals_chains():
    from hf_tiny import tiny_janus

    from ambiguity.models.janus import JanusModel

    model, tok = tiny_janus()
    m = JanusModel(model, tok, name="janus-tiny")  # a Llama decoder behind 4D masks and position ids
    gen = torch.Generator().manual_seed(1)
    for guided in (False, True):
        prompt = m.make_prompt(["a cat", "a big dog on grass"][: 1 + guided][-1:], guided=guided)
        with torch.no_grad():
            _check_tree_attention(m, prompt, 3, guided, gen)


# --------------------------------------------------------------------------- exhaustive enumeration
class ScriptedDraws:
    """Draws that follow a script of option indices and log every decision with its options."""

    def __init__(self, script):
        self.script, self.pos, self.log, self.last_u = list(script), 0, [], float("nan")

    def _choose(self, options):
        if self.pos == len(self.script):
            self.script.append(0)
        self.log.append(options)
        choice = options[self.script[self.pos]]
        self.pos += 1
        return choice[0]

    def coin(self, prob):
        prob = min(max(float(prob), 0.0), 1.0)
        return self._choose([o for o in ((True, prob), (False, 1.0 - prob)) if o[1] > 0])

    def categorical(self, probs):
        p = probs.double() / probs.double().sum()
        return self._choose([(v, float(p[v])) for v in range(len(p)) if p[v] > 0])


def enumerate_outcomes(run):
    """{outcome: probability} of ``run(draws)`` over every branch of its draws (depth-first)."""
    out, stack, runs = defaultdict(float), [[]], 0
    while stack:
        script = stack.pop()
        d = ScriptedDraws(script)
        result = run(d)
        runs += 1
        out[result] += math.prod(opts[i][1] for opts, i in zip(d.log, d.script))
        for i in range(len(script), len(d.log)):
            stack.extend(d.script[:i] + [alt] for alt in range(1, len(d.log[i])))
    return out, runs


def exact_joint(model, label, s):
    """P(x_0..x_{N-1}) of AR sampling by teacher forcing every prefix (dict over token tuples)."""
    V, N = model.vocab_size, model.num_tokens
    seqs = list(itertools.product(range(V), repeat=N))
    tokens = torch.tensor(seqs)
    prompt = model.make_prompt([label] * len(seqs), guided=s.guided)
    with torch.no_grad():
        logits = model.teacher_force(prompt, expand_rows(tokens, s.guided)).logits
    p = distribution(logits, s, s.guided).double()
    probs = p.gather(-1, tokens[..., None])[..., 0].prod(-1)
    return {seq: float(v) for seq, v in zip(seqs, probs) if v > 0}


TREES = {
    "dynamic": TreeSpec("dynamic", total_tokens=5, depth=1, top_k=2),
    "static": TreeSpec("static", ((0,), (1,), (0, 0)), name="small"),
}


@pytest.mark.slow  # ~25 s: the static tree's draws without replacement branch into ~1700 runs
@pytest.mark.parametrize(
    "tree, sampling",
    [
        ("dynamic", SamplingConfig(guidance=1.0, temperature=1.0)),
        ("dynamic", SamplingConfig(guidance=2.0, temperature=0.7, top_k=3)),
        ("static", SamplingConfig(guidance=1.0, temperature=1.0, top_k=3)),
        ("static", SamplingConfig(guidance=2.0, temperature=1.3, top_p=0.9)),
    ],
)
def test_exact_tree_decoding_at_delta_zero_is_ar_sampling(tree, sampling):
    """Every random outcome of tree_decode, weighted by its probability, gives exactly the AR joint
    (V = 4, 2 x 2 tokens): LANTERN δ = 0 (neighbours of zero mass are still "moved", and the
    exact residual keeps it lossless) and SD alike. Also: some steps accept drafts and some
    reject siblings, so the residual chain over siblings is exercised."""
    m = tiny()
    d = Drafter.for_target(m, seed=3).eval()
    nb = build_neighbourhoods(m.input_embeddings(), 2, "l2", cache=False).indices
    want = exact_joint(m, 1, sampling)
    prompt = m.make_prompt([1], guided=sampling.guided)
    stats = defaultdict(int)

    def run(draws):
        out = tree_decode(m, d, prompt, sampling, rule, nb, TREES[tree], draws=draws)
        stats["accepted"] += int(out.steps["accepted"].sum())
        stats["rejections"] += int((out.drafts["reached"] & ~out.drafts["accepted"]).sum())
        return tuple(out.tokens[0].tolist())

    rules = [AcceptanceRule("lantern", k=2, delta=0.0)] + ([AcceptanceRule("sd")] if tree == "dynamic" else [])
    for rule in rules:  # noqa: B007 (run() reads rule)
        got, runs = enumerate_outcomes(run)
        assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
        assert set(got) <= set(want) and runs > 10
        for seq, prob in want.items():
            assert got.get(seq, 0.0) == pytest.approx(prob, abs=1e-12), seq
    assert stats["accepted"] > 0 and stats["rejections"] > 0


@pytest.mark.slow
def test_relaxed_tree_decoding_is_not_ar_sampling():
    """Power check: the same enumeration with δ = 0.4 moves the joint away from AR."""
    m = tiny()
    d = Drafter.for_target(m, seed=3).eval()
    nb = build_neighbourhoods(m.input_embeddings(), 2, "l2", cache=False).indices
    s = SamplingConfig(guidance=1.0, temperature=1.0)
    want = exact_joint(m, 1, s)
    prompt = m.make_prompt([1])
    got, _ = enumerate_outcomes(
        lambda dr: tuple(
            tree_decode(m, d, prompt, s, AcceptanceRule("lantern", k=2, delta=0.4), nb, TREES["dynamic"], draws=dr)
            .tokens[0]
            .tolist()
        )
    )
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-9)
    assert max(abs(got.get(k, 0.0) - v) for k, v in want.items()) > 1e-3


# --------------------------------------------------------------------------- greedy
@pytest.mark.parametrize("convention", ["exact", "official"])
def test_greedy_tree_decoding_equals_greedy_ar(convention):
    m = tiny(vocab=32, block=16, dim=32, std=0.5)
    d = Drafter.for_target(m, seed=2).eval()
    nb = build_neighbourhoods(m.input_embeddings(), 8, "l2", cache=False).indices
    accepted = 0
    for spec in (
        TreeSpec("dynamic", total_tokens=10, depth=3, top_k=3),
        TreeSpec("static", STATIC_TREES["mc_sim_7b_63"]),
    ):
        for guidance, label in ((1.0, 0), (3.0, 5)):
            s = SamplingConfig(guidance=guidance, temperature=0.0)
            prompt = m.make_prompt([label], guided=s.guided)
            ar = sample_tokens(m, prompt, s)
            for rule in (
                AcceptanceRule("sd", convention=convention),
                AcceptanceRule("lantern", k=8, delta=0.0, convention=convention),
            ):
                out = tree_decode(m, d, prompt, s, rule, nb, spec)
                assert torch.equal(out.tokens, ar), (spec.kind, guidance, rule.method)
                accepted += int(out.steps["accepted"].sum())
    assert accepted > 0


# --------------------------------------------------------------------------- official verdicts
def _toy_tree(tokens, parents, q=None):
    children = [[] for _ in tokens]
    for t in range(1, len(tokens)):
        children[parents[t]].append(t)
    depths = [0]
    for t in range(1, len(tokens)):
        depths.append(depths[parents[t]] + 1)
    return Tree(torch.tensor(tokens), parents, depths, children, q or [None] * len(tokens), sampled=q is not None)


F64 = torch.float64


def test_official_dynamic_walk_hand_case():
    """Root children x̂ = 0 then 3 (q(x̂) = 1), p = (8, 1, 3, 4)/16, B: 0 -> (1, 2), k = 1, δ = 1/16.
    x̂ = 0: S_1 = p(1) = 1/16 <= δ, j* = 1, p̃ = 9/16; rejected (coin False) -> the official code
    zeroes 0 and B_2(0) = {1, 2}: the target becomes e_3 and x̂ = 3 has p̃ = 1: accepted.
    The exact convention zeroes only 0: (0, 1, 3, 4)/8, p̃(3) = 4/8 (B_1(3) = {2} moves 3/8 > δ)."""
    p = torch.tensor([[8, 1, 3, 4]] * 3, dtype=F64) / 16
    table = torch.tensor([[1, 2, 3], [0, 2, 3], [3, 0, 1], [2, 1, 0]])
    tree = _toy_tree([0, 0, 3], [-1, 0, 0])
    for convention, second in (("official", 1.0), ("exact", 0.5)):
        rule = AcceptanceRule("lantern", k=1, delta=1 / 16, convention=convention)
        draws = ScriptedDraws([1, 0, 0])  # first coin False (reject), second coin True, final draw option 0
        out = walk_tree(tree, p, rule, table, False, draws)
        t1, t2 = out.trials
        assert (t1["p_tilde"], t1["j_star"], t1["accept_prob"], t1["accepted"]) == (9 / 16, 1, 9 / 16, False)
        assert t2["p_tilde"] == pytest.approx(second) and t2["accepted"] and out.path == [0, 2]
        assert out.kind == "bonus"


def test_official_static_walk_hand_case():
    """Sampled siblings x̂ = 1 then 2 from q = (1, 2, 1, 0)/4 at the root, p = (2, 1, 1, 0)/4,
    B: 1 -> (0, ...), 2 -> (3, ...), k = 1, δ = 1/4. x̂ = 1: q_cond = 1/2, S_1 = p(0) = 1/2 > δ,
    j* = 0, accept prob (1/4)/(1/2) = 1/2; rejected -> norm(max(p - q, 0)) = e_0 (both
    conventions: nothing zapped). x̂ = 2: q_cond = q without 1 = (1, 0, 1, 0)/2 -> 1/2; target e_0,
    S_1 = p'(3) = 0 <= δ, j* = 1, p̃ = 0 -> never accepted; then the residual: exact
    norm(max(e_0 - q_cond, 0)) = e_0; official zeroes B_2(2) = {3, 0} in q_cond first: still e_0."""
    p = torch.tensor([[2, 1, 1, 0]] * 3, dtype=F64) / 4
    q_root = torch.tensor([1, 2, 1, 0], dtype=torch.float32) / 4
    table = torch.tensor([[1, 2, 3], [0, 2, 3], [3, 0, 1], [2, 1, 0]])
    tree = _toy_tree([3, 1, 2], [-1, 0, 0], q=[q_root, None, None])
    for convention in ("exact", "official"):
        rule = AcceptanceRule("lantern", k=1, delta=0.25, convention=convention)
        out = walk_tree(tree, p, rule, table, False, ScriptedDraws([1, 0]))  # reject x̂ = 1; x̂ = 2: p̃ = 0
        t1, t2 = out.trials
        assert (t1["q_draft"], t1["accept_prob"], t1["j_star"]) == (0.5, 0.5, 0)
        assert (t2["q_draft"], t2["p_tilde"], t2["accept_prob"]) == (0.5, 0.0, 0.0)
        assert out.path == [0] and out.token == 0 and out.kind == "residual"


def test_official_greedy_takes_the_longest_passing_path():
    """Tree: root -> a (token 0), b (token 1); a -> c (token 2); b -> d (token 3), e (token 2).
    Unfiltered p at the root: (4, 4, 0, 0)/8 -> a passes (ties go to the lower index), b fails.
    Hence the longest path is root-a-c if c passes: p at a = e_2 -> c passes. Exact greedy accepts
    ties, the official argmax takes code 0: both follow a here; with p at the root (3, 5, 0, 0)/8
    only b passes, and the first passing leaf path wins."""
    table = torch.tensor([[1, 2, 3], [0, 2, 3], [3, 0, 1], [2, 1, 0]])
    tree = _toy_tree([0, 0, 1, 2, 3, 2], [-1, 0, 0, 1, 2, 2])
    rule = AcceptanceRule("sd", convention="official")
    p = (
        torch.tensor([[4, 4, 0, 0], [0, 0, 8, 0], [0, 0, 0, 8], [1, 1, 1, 5], [1, 1, 1, 5], [1, 1, 1, 5]], dtype=F64)
        / 8
    )
    out = walk_official_greedy(tree, p, rule, table)
    assert out.path == [0, 1, 3] and out.token == 3 and out.kind == "bonus"
    p[0] = torch.tensor([3, 5, 0, 0], dtype=F64) / 8
    out = walk_official_greedy(tree, p, rule, table)
    assert out.path == [0, 2, 4] and out.token == 3  # b -> d (token 3 = argmax at b) passes; e does not
    assert walk_tree(tree, p, AcceptanceRule("sd"), table, True, None).path == [0, 2, 4]


def test_official_greedy_static_tie_goes_to_the_first_sorted_path():
    """Issue 21: static tree [[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0]] with drafts (0) and (2) both
    passing. The official code numbers nodes by (depth, path) and sorts its root-to-leaf index
    paths lexicographically: (0,0,0) -> [0,1,4,7] comes before (2) -> [0,3], both accept one
    draft, so argmax keeps (0): path [0, 1], next token argmax p at node 1 = 3. A dynamic tree
    (EAGLE-2 lists leaves by node index) keeps the first leaf by index, (2): next token 2.
    Drafts: the TokenDrafter's top ranks, root token 1 -> (1, 0, 2); 1 -> (1, 0); 0 -> (0,).
    p at the root (1, 4, 3, 0)/8, k = 1, δ = 0.6, B_1: 0 -> 3, 1 -> 2, 2 -> 1: draft 1 has
    p̃ = 7/8, draft 2 p̃ = 7/8 (both pass), draft 0 p̃ = 1/8 (fails); below, p = e_3 fails every
    draft (tokens 0 and 1); p at node 3 = e_2."""
    from reference.trees import draft_tree

    V = 4
    L = torch.zeros(V, V)
    L[1] = torch.tensor([2.0, 3.0, 1.0, 0.0])
    L[0] = torch.tensor([3.0, 0.0, 0.0, 0.0])
    m = tiny(vocab=V, block=16, dim=16)
    spec = TreeSpec("static", ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
    d = TokenDrafter(L)
    q_of = lambda logits: torch.softmax(logits[0].double(), -1)
    tree = draft_tree(
        d, m, d.new_cache(1), torch.tensor([[3, 1]]), torch.zeros(1, 2, 4), 0, spec, 10, q_of, True, None, False
    )
    assert tree.static and tree.tokens.tolist() == [1, 1, 0, 2, 1, 0, 0, 1]
    assert tree.parents == [-1, 0, 0, 0, 1, 1, 2, 4]  # node t + 1 is the t-th path in (depth, path) order
    assert tree.official_leaves() == [7, 5, 6, 3]
    table = torch.tensor([[3, 1, 2], [2, 0, 3], [1, 0, 3], [0, 1, 2]])
    rule = AcceptanceRule("lantern", k=1, delta=0.6, convention="official")
    p = torch.zeros(len(tree), V, dtype=F64)
    p[:, 3] = 1.0
    p[0] = torch.tensor([1, 4, 3, 0], dtype=F64) / 8
    p[3] = torch.tensor([0, 0, 1, 0], dtype=F64)
    out = walk_official_greedy(tree, p, rule, table)
    passed = {tr["node"] for tr in out.trials if tr["accepted"]}
    assert passed == {1, 3}
    assert out.path == [0, 1] and out.token == 3 and out.kind == "residual"
    tree.static = False  # the same tree read as a dynamic one: leaves by node index
    assert tree.official_leaves() == [3, 5, 6, 7]
    out = walk_official_greedy(tree, p, rule, table)
    assert out.path == [0, 3] and out.token == 2 and out.kind == "bonus"


# --------------------------------------------------------------------------- dynamic tree shape
class TokenDrafter:
    """A drafter whose next-token logits depend only on the token it reads: row ``x`` of ``L``.
    Features carry the token id (feature 0), so q is known in closed form."""

    def __init__(self, L):
        self.L, self.target = L, {}

    class Cache:
        def __init__(self):
            self.length = 0

    def new_cache(self, rows, spare=0):
        return self.Cache()

    def rollback(self, cache, n):
        cache.length = n

    def __call__(self, model, tokens, features, cache=None, start=0, positions=None, attend=None):
        if cache is not None:
            cache.length = (cache.length if positions is not None else start) + tokens.shape[1]
        f = torch.zeros(*tokens.shape, 4)
        f[..., 0] = tokens.float()
        return f

    def logits(self, model, f):
        return self.L[f[..., 0].long()]


def reference_dynamic(L, root, total, depth, k):
    """EAGLE-2 by the book, on lists: beam search by cumulative log-prob, then the best total - 1."""
    logq = torch.log_softmax(L.double(), -1)
    cands = []  # (score, index, token, parent candidate)
    top = logq[root].topk(k)
    for s_, t_ in zip(top.values.tolist(), top.indices.tolist()):
        cands.append((s_, len(cands), t_, -1))
    beam = list(range(k))
    for _ in range(depth):
        new = []
        for b in beam:
            ch = logq[cands[b][2]].topk(k)
            for s_, t_ in zip(ch.values.tolist(), ch.indices.tolist()):
                new.append((cands[b][0] + s_, len(cands), t_, b))
                cands.append(new[-1])
        beam = [c[1] for c in sorted(new, key=lambda c: (-c[0], c[1]))[:k]]
    keep = sorted(c[1] for c in sorted(cands, key=lambda c: (-c[0], c[1]))[: total - 1])
    return [(cands[i][2], cands[i][3]) for i in keep], keep


def test_dynamic_tree_is_eagle2_beam_search_then_rerank():
    torch.manual_seed(0)
    V = 6
    L = torch.randn(V, V) * 2
    m = tiny(vocab=V, block=16, dim=16)
    from reference.trees import draft_tree

    q_of = lambda logits: torch.softmax(logits[0].double(), -1)  # (rows, F, V) -> (F, V)
    for total, depth, k in ((8, 2, 3), (12, 3, 2), (5, 1, 4)):
        spec = TreeSpec("dynamic", total_tokens=total, depth=depth, top_k=k)
        d = TokenDrafter(L)
        tree = draft_tree(
            d, m, d.new_cache(1), torch.tensor([[4, 1]]), torch.zeros(1, 2, 4), 0, spec, 10, q_of, False, None, False
        )
        want, keep = reference_dynamic(L, 1, total, depth, k)
        assert tree.tokens.tolist()[0] == 1 and len(tree) == total
        assert tree.tokens.tolist()[1:] == [t for t, _ in want]
        index = {c: i + 1 for i, c in enumerate(keep)}
        assert tree.parents[1:] == [0 if par < 0 else index[par] for _, par in want]
        assert max(tree.depths) <= depth + 1 and all(tree.parents[t] < t for t in range(1, total))


def test_top_log_q_ranks_like_the_logs_of_the_whole_vocabulary():
    """EAGLE-2 scores: top-k of q itself, then the k logs, equals top-k of the float64 logs of the
    whole vocabulary (indices in the same order, ties and zero-mass tokens included, same floats)."""
    q = torch.tensor([0.5, 0.25, 0.0, 0.25], dtype=torch.float32)
    values, indices = top_log_q(q, 2)
    assert indices.tolist() == [0, 1] and values.dtype == torch.float64
    assert values.tolist() == [math.log(0.5), math.log(0.25)]
    values, indices = top_log_q(q, 4)
    assert values[-1].item() == float("-inf") and indices[-1].item() == 2
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for levels in (3, 16, 1000):  # few distinct values: many exact ties
            q = (torch.randint(0, levels, (6, 4096)).to(dtype) / levels) ** 3
            q[:2, 8:] = 0.0  # rows with fewer tokens of mass than k
            q[2, :5] = 1e-44 if dtype == torch.float32 else 1e-310  # subnormal probabilities
            q = q / q.sum(-1, keepdim=True)
            for k in (1, 10, 64):
                want = log_q(q).topk(k)
                values, indices = top_log_q(q, k)
                assert torch.equal(indices, want.indices) and torch.equal(values, want.values)
    x = 1e-200  # its log, -460.5, has a float64 spacing of 6e-14; x itself of 2e-16 relative
    pair = torch.tensor([x, math.nextafter(x, 1.0)], dtype=torch.float64)  # two doubles, one log
    assert log_q(pair)[0] == log_q(pair)[1]
    want = log_q(pair).topk(1)
    assert top_log_q(pair, 1)[1].tolist() == want.indices.tolist()


@pytest.mark.parametrize("convention", ["exact", "official"])
@pytest.mark.parametrize("delta", [0.0, 0.15, 0.5])
def test_sibling_output_distribution_is_the_real_walks_first_token(convention, delta):
    """Every branch of the real dynamic-tree walk at a root with three deterministic children
    (V = 6, k = 2), enumerated with its probability: the law of the first emitted token (the
    accepted child, or the residual / bonus draw when none is accepted) equals
    :func:`lantern.distortion.sibling_output_distribution`, for both conventions, to 1e-12."""
    g = torch.Generator().manual_seed(7)
    V, kids = 6, [4, 1, 3]
    p_root = torch.rand(V, generator=g, dtype=F64) ** 2
    p_root /= p_root.sum()
    p = torch.cat([p_root[None], torch.full((3, V), 1.0 / V, dtype=F64)])  # leaves: any p
    table = torch.stack([torch.tensor([(v + j) % V for j in range(1, V)]) for v in range(V)])
    tree = _toy_tree([0] + kids, [-1, 0, 0, 0])
    rule = AcceptanceRule("lantern", k=2, delta=delta, convention=convention)

    def first_token(draws):
        out = walk_tree(tree, p, rule, table, False, draws)
        return int(tree.tokens[out.path[1]]) if len(out.path) > 1 else out.token

    got, _ = enumerate_outcomes(first_token)
    want = sibling_output_distribution(p_root, torch.tensor(kids), table, rule)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    for v in range(V):
        assert got.get(v, 0.0) == pytest.approx(float(want[v]), abs=1e-12), v
    if convention == "exact" and delta == 0.0:
        assert torch.allclose(want, p_root, atol=1e-15)  # recursive rejection without replacement: lossless
