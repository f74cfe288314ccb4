"""Draft vocabulary (EAGLE-3's frequent-token head): selection by mass, q on the full vocabulary
exactly zero outside it, today's q for a full vocabulary, files and the command (tiny models)."""

import pytest
import torch
from test_drafter import N_TOK, tiny_model

from ambiguity.errors import UsageError
from ambiguity.sampling import SamplingConfig, distribution, guide
from lantern.drafter.model import Drafter, check_draft_vocab, draft_q, load_drafter
from lantern.drafter.vocab import check_size, code_mass, coverage, restrict_logits, select_draft_vocab
from lantern.engine.decode import DecodeConfig, decode

V = 64  # the tiny model's vocabulary
VOCAB = torch.tensor([1, 4, 5, 9, 17, 20, 33, 40, 41, 50, 62, 63])


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def drafter(model):
    torch.manual_seed(1)
    return Drafter.for_target(model, seed=2).eval()


def with_vocab(drafter, vocab):
    d = Drafter(drafter.layer, drafter.hidden_size, drafter.target)
    d.load_state_dict({k: v for k, v in drafter.state_dict().items() if k != "draft_vocab"})
    d.set_draft_vocab(vocab)
    return d.eval()


# --------------------------------------------------------------------------- selection
def test_selection_takes_the_largest_mass_ties_to_the_lower_code_and_returns_ascending():
    mass = torch.tensor([0.10, 0.40, 0.05, 0.30, 0.15])
    assert select_draft_vocab(mass, 1).tolist() == [1]
    assert select_draft_vocab(mass, 2).tolist() == [1, 3]
    assert select_draft_vocab(mass, 3).tolist() == [1, 3, 4]
    assert select_draft_vocab(mass, 5).tolist() == [0, 1, 2, 3, 4]
    assert select_draft_vocab(torch.tensor([0.2, 0.2, 0.2, 0.4]), 2).tolist() == [0, 3]
    assert coverage(mass, select_draft_vocab(mass, 2)) == pytest.approx(0.70 / 1.0)
    assert coverage(mass * 3, torch.tensor([0, 4])) == pytest.approx(0.25)
    assert coverage(mass, torch.arange(5)) == pytest.approx(1.0)


@pytest.mark.parametrize("size", [0, -1, 6])
def test_sizes_outside_one_to_v_are_refused(size):
    with pytest.raises(UsageError, match="--size must be between 1 and the vocabulary size 5"):
        select_draft_vocab(torch.ones(5), size)
    with pytest.raises(UsageError, match="--size"):
        check_size(size, 5)


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.tensor([3, 1]), "strictly ascending"),
        (torch.tensor([1, 1]), "strictly ascending"),
        (torch.tensor([0, 64]), "0..63"),
        (torch.tensor([-1, 2]), "0..63"),
        (torch.tensor([], dtype=torch.long), "non-empty"),
        (torch.tensor([[1, 2]]), "1-D"),
        (torch.tensor([1.0, 2.0]), "integer"),
    ],
)
def test_bad_draft_vocabularies_are_refused(bad, match):
    with pytest.raises(UsageError, match=match):
        check_draft_vocab(bad, V)


def test_code_mass_sums_the_sampling_distribution_of_every_position(model):
    tokens = torch.randint(0, V, (3, N_TOK), generator=torch.Generator().manual_seed(0))
    labels = [2, 5, 7]
    s = SamplingConfig(guidance=2.0, temperature=1.0, top_k=10)
    mass = code_mass(model, tokens, labels, s, batch_size=2)
    assert mass.dtype == torch.float64 and mass.shape == (V,)
    assert float(mass.sum()) == pytest.approx(3 * N_TOK, rel=1e-6)
    want = torch.zeros(V, dtype=torch.float64)
    for i in range(3):  # one sequence at a time, by hand: guided rows, p per position
        logits = model.teacher_force(model.make_prompt([labels[i]], guided=True), tokens[[i, i]]).logits
        want += distribution(logits, s, True).double().sum((0, 1))
    torch.testing.assert_close(mass, want, rtol=1e-5, atol=1e-6)
    assert int((mass > 0).sum()) <= 3 * N_TOK * 10  # top-k 10: at most 10 codes per position


# --------------------------------------------------------------------------- q
SAMPLINGS = [
    SamplingConfig(guidance=3.0, temperature=1.0, top_k=0),
    SamplingConfig(guidance=3.0, temperature=0.7, top_k=5, top_p=0.9),
    SamplingConfig(guidance=1.0, temperature=1.0, top_k=40),
    SamplingConfig(guidance=3.0, temperature=0.0),
]


@pytest.mark.parametrize("s", SAMPLINGS, ids=["cfg3", "topk5-topp0.9", "topk40-unguided", "greedy"])
def test_q_is_zero_outside_the_draft_vocab_sums_to_one_and_is_p_of_minus_inf_logits(model, drafter, s):
    d = with_vocab(drafter, VOCAB)
    rows = 6 if s.guided else 3
    f = torch.randn(rows, 2, model.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        q = draft_q(d, model, f, lambda x: distribution(x, s, s.guided))
        full = d.logits(model, f)
    assert q.shape == (3, 2, V)
    outside = torch.ones(V, dtype=torch.bool)
    outside[VOCAB] = False
    assert torch.equal(q[..., outside], torch.zeros_like(q[..., outside]))
    torch.testing.assert_close(q.sum(-1), torch.ones(3, 2), rtol=0, atol=1e-6)
    # the reference: guidance on the full logits, then -inf outside, then temperature, filters, softmax
    x = guide(full, s.guidance, s.guided).masked_fill(outside, float("-inf"))
    ref = distribution(x, SamplingConfig(guidance=1.0, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p))
    torch.testing.assert_close(q, ref, rtol=1e-5, atol=1e-7)
    if s.greedy:  # the drafter's greedy draft: the argmax of the full logits among the draft vocab
        assert set(q.argmax(-1).flatten().tolist()) <= set(VOCAB.tolist())
        assert torch.equal(q.argmax(-1), VOCAB[guide(full, s.guidance, True)[..., VOCAB].argmax(-1)])


def test_q_by_hand_on_a_three_code_vocab(model, drafter):
    d = with_vocab(drafter, torch.tensor([2, 7, 30]))
    f = torch.randn(1, 1, model.hidden_size, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        q = draft_q(d, model, f, lambda x: distribution(x, SamplingConfig(guidance=1.0), False))[0, 0]
        z = d.logits(model, f)[0, 0, [2, 7, 30]].double()
    e = (z - z.max()).exp()
    want = torch.zeros(V, dtype=torch.float64)
    want[[2, 7, 30]] = e / e.sum()
    torch.testing.assert_close(q.double(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("s", SAMPLINGS, ids=["cfg3", "topk5-topp0.9", "topk40-unguided", "greedy"])
def test_a_full_draft_vocabulary_gives_exactly_todays_q(model, drafter, s):
    full = with_vocab(drafter, torch.arange(V))
    rows = 6 if s.guided else 3
    f = torch.randn(rows, 1, model.hidden_size, generator=torch.Generator().manual_seed(4))
    to_q = lambda x: distribution(x, s, s.guided)
    with torch.no_grad():
        assert torch.equal(draft_q(full, model, f, to_q), to_q(drafter.logits(model, f)))
        assert torch.equal(draft_q(drafter, model, f, to_q), to_q(drafter.logits(model, f)))


def test_draft_logits_are_the_head_rows_of_the_draft_vocab(model, drafter):
    d = with_vocab(drafter, VOCAB)
    f = torch.randn(4, model.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(d.draft_logits(model, f), d.logits(model, f)[:, VOCAB])
    assert torch.equal(restrict_logits(torch.zeros(2, V), VOCAB).isfinite().sum(-1), torch.tensor([12, 12]))


@pytest.mark.parametrize("method", ["chain-sampled", "chain-greedy", "dynamic-tree"])
def test_decoding_drafts_only_draft_vocabulary_codes_and_a_full_vocab_decodes_todays_tokens(model, drafter, method):
    from lantern.methods.tree.spec import TreeSpec

    tree = TreeSpec("dynamic", total_tokens=8, depth=3, top_k=3) if method == "dynamic-tree" else None
    config = DecodeConfig.of("sd", 3, tree=tree)
    s = SamplingConfig(guidance=2.0, temperature=0.0 if method == "chain-greedy" else 1.0)
    labels = [0, 3, 7]
    today = decode(model, labels, config, s, drafter, seed=1)
    same = decode(model, labels, config, s, with_vocab(drafter, torch.arange(V)), seed=1)
    assert torch.equal(today.tokens, same.tokens)
    assert list(today.drafts["token"]) == list(same.drafts["token"])
    small = decode(model, labels, config, s, with_vocab(drafter, VOCAB), seed=1)
    assert len(small.drafts["token"]) > 0
    assert {int(t) for t in small.drafts["token"]} <= set(VOCAB.tolist())


# --------------------------------------------------------------------------- files and command
def test_the_draft_vocab_travels_in_the_drafter_file(model, drafter, tmp_path):
    plain = drafter.save(tmp_path / "plain.safetensors")
    assert load_drafter(model, plain).draft_vocab is None
    path = with_vocab(drafter, VOCAB).save(tmp_path / "vocab.safetensors", draft_vocab={"size": 12})
    back = load_drafter(model, path)
    assert back.draft_vocab.dtype == torch.int64 and torch.equal(back.draft_vocab, VOCAB)
    assert back.info["draft_vocab"] == {"size": 12}
    from ambiguity.io import load_tensors, save_tensors

    state, meta = load_tensors(path)
    state["draft_vocab"] = torch.tensor([5, 3])
    save_tensors(state, tmp_path / "bad.safetensors", meta)
    with pytest.raises(UsageError, match="bad.safetensors: a draft vocabulary must be strictly ascending"):
        load_drafter(model, tmp_path / "bad.safetensors")


def test_command_writes_the_shipped_drafter_with_a_draft_vocab_and_refuses_bad_sizes(tmp_path, capsys):
    from ambiguity.models.registry import load_model
    from lantern.drafter.vocab import main

    out = tmp_path / "d.safetensors"
    base = ["--model", "embedded", "--device", "cpu", "--images", "2", "--batch-size", "2", "--no-progress"]
    assert main([*base, "--size", "1025", "--out", str(out)]) == 2
    assert "--size must be between 1 and the vocabulary size 1024, got 1025" in capsys.readouterr().err
    assert main([*base, "--size", "0", "--out", str(out)]) == 2
    assert "--size" in capsys.readouterr().err
    assert not out.exists()
    assert main([*base, "--size", "100", "--top-k", "125", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "draft vocabulary: 100 of 1024 codes hold" in text
    d = load_drafter(load_model("embedded"), out)
    assert d.draft_vocab.shape == (100,) and bool((d.draft_vocab[1:] > d.draft_vocab[:-1]).all())
    facts = d.info["draft_vocab"]
    assert facts["size"] == 100 and facts["images"] == 2 and facts["sampling"]["top_k"] == 125
    assert 0 < facts["coverage"] < 1 and f"{100 * facts['coverage']:.2f} %" in text
    full = tmp_path / "full.safetensors"
    assert main([*base, "--size", "1024", "--drafter", str(out), "--out", str(full)]) == 0
    back = load_drafter(load_model("embedded"), full)
    assert back.draft_vocab is None and "draft_vocab" not in back.info
    assert torch.equal(back.fc.weight, d.fc.weight)
