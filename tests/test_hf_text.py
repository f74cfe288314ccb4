"""``hf:<repo>`` text adapter on tiny random Llama and GPT-2 causal LMs (offline, CPU)."""

import pytest
import torch
from hf_tiny import save, save_to_hf_cache, tiny_gpt2, tiny_llama, use_hf_cache

from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.generation import sample_tokens
from ambiguity.models.hf_text import HFCausalLM, load_hf_causal_lm, read_prompts
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig

PROMPTS = ["hello there, old friend", "hi"]
L = 6


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny(request):
    model, tok = (tiny_llama if request.param == "llama" else tiny_gpt2)()
    return request.param, model, tok, HFCausalLM(model, tok, name=f"hf:tiny-{request.param}", length=L)


def _ids(lm, rows, n, seed=0):
    return torch.randint(0, lm.vocab_size, (rows, n), generator=torch.Generator().manual_seed(seed))


def test_vocabulary_is_the_token_space(tiny):
    _, model, tok, lm = tiny
    assert lm.kind == "text" and lm.grid == (1, L) and lm.num_tokens == L
    assert lm.vocab_size == model.get_output_embeddings().weight.shape[0] == len(tok)
    assert torch.equal(lm.image_token_ids, torch.arange(len(tok)))
    ids = torch.tensor([[5, 17, 3]])
    assert torch.equal(lm.to_vocab_ids(ids), ids) and torch.equal(lm.to_code_indices(ids), ids)
    with pytest.raises(NotImplementedError):
        lm.codebook()
    with pytest.raises(NotImplementedError):
        lm.decode_codes(torch.zeros(1, 1, L, dtype=torch.long))


def test_prompts_use_the_tokenizer_and_left_padding(tiny):
    name, _, tok, lm = tiny
    p = lm.make_prompt(PROMPTS)
    ids, mask = p.inputs["ids"], p.inputs["mask"]
    for i, text in enumerate(PROMPTS):
        want = tok(text)["input_ids"]
        assert ids[i, -len(want) :].tolist() == want and int(mask[i].sum()) == len(want)
    if name == "llama":  # Llama tokenizers start with BOS; the short row is left-padded
        assert ids[1, -3:].tolist() == [tok.bos_token_id] + tok("hi", add_special_tokens=False)["input_ids"]
        assert ids[1, 0] == lm.pad_id and mask[1, 0] == 0
    assert lm.make_prompt([""]).inputs["ids"].tolist() == [[lm.start_id]]


def test_logits_equal_the_causal_lm(tiny):
    _, model, _, lm = tiny
    p = lm.make_prompt(PROMPTS[:1])
    tokens = _ids(lm, 1, L)
    step = lm.teacher_force(p, tokens)
    assert step.logits.shape == (1, L, lm.vocab_size) and torch.isfinite(step.logits).all()
    P = p.inputs["ids"].shape[1]
    with torch.no_grad():
        direct = model(input_ids=torch.cat([p.inputs["ids"], tokens[:, :-1]], 1)).logits[:, P - 1 :]
    torch.testing.assert_close(step.logits, direct, atol=1e-5, rtol=0)


def test_prefill_extend_rollback_and_padding(tiny):
    _, _, _, lm = tiny
    p = lm.make_prompt(PROMPTS)
    tokens, other = _ids(lm, 2, L, seed=1), _ids(lm, 2, L, seed=2)
    tf = lm.teacher_force(p, tokens)
    cache = lm.new_cache(p)
    steps = [lm.prefill(p, cache), lm.extend(cache, tokens[:, :2]), lm.extend(cache, tokens[:, 2:5])]
    torch.testing.assert_close(torch.cat([s.logits for s in steps], 1), tf.logits, atol=1e-5, rtol=0)
    lm.rollback(cache, 1)
    lm.extend(cache, torch.cat([tokens[:, 1:2], other[:, 2:4]], 1))  # one accepted, two rejected
    lm.rollback(cache, 2)
    torch.testing.assert_close(lm.extend(cache, tokens[:, 2:5]).logits, tf.logits[:, 3:6], atol=1e-5, rtol=0)
    alone = lm.teacher_force(lm.make_prompt(PROMPTS[1:]), tokens[1:])  # the left-padded row, unpadded
    torch.testing.assert_close(tf.logits[1:], alone.logits, atol=1e-5, rtol=0)


def test_greedy_sampling_equals_generate(tiny):
    _, model, _, lm = tiny
    p = lm.make_prompt(PROMPTS[:1])
    out = sample_tokens(lm, p, SamplingConfig(temperature=0.0))
    with torch.no_grad():
        ref = model.generate(
            input_ids=p.inputs["ids"],
            attention_mask=p.inputs["mask"],
            do_sample=False,
            max_new_tokens=L,
            min_new_tokens=L,
            pad_token_id=lm.pad_id,
        )
    assert out.tolist() == ref[:, p.inputs["ids"].shape[1] :].tolist()
    sampled = sample_tokens(
        lm, lm.make_prompt(PROMPTS), SamplingConfig(top_p=0.9), generator=torch.Generator().manual_seed(0)
    )
    assert sampled.shape == (2, L)


def test_draft_layer_is_the_models_layer_class_and_caches(tiny):
    name, _, _, lm = tiny
    layer = lm.draft_layer()
    assert type(layer.layer).__name__ == {"llama": "LlamaDecoderLayer", "gpt2": "GPT2Block"}[name]
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = layer(x, None, 0)
        cache = layer.new_cache(2)
        parts = [layer(x[:, :5], cache, 0), layer(x[:, 5:], cache, 5)]
        torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)
        layer.rollback(cache, 2)
        torch.testing.assert_close(layer(x[:, 2:6], cache, 2), full[:, 2:6], atol=1e-5, rtol=0)
    assert any(p.requires_grad for p in layer.parameters())  # trainable, unlike the target


def test_cfg_and_default_conditions_are_refused(tiny):
    _, _, _, lm = tiny
    with pytest.raises(UsageError, match="--cfg 1"):
        lm.make_prompt(PROMPTS, guided=True)
    with pytest.raises(NotImplementedError):  # the profile passes prompts from a file
        lm.default_conditions(4)
    with pytest.raises(UsageError):
        lm.make_prompt([])


def test_load_by_registry_name_path_and_cache(tmp_path, monkeypatch):
    model, tok = tiny_gpt2()
    src = save(model, tok, tmp_path / "gpt2-tiny")
    tokens = torch.randint(0, len(tok), (1, 4), generator=torch.Generator().manual_seed(4))
    want = HFCausalLM(model, tok).teacher_force(HFCausalLM(model, tok).make_prompt(["abc"]), tokens).logits
    by_path = load_model(f"hf:{src}", device="cpu")
    assert by_path.name == f"hf:{src}" and by_path.kind == "text"
    torch.testing.assert_close(by_path.teacher_force(by_path.make_prompt(["abc"]), tokens).logits, want)
    save_to_hf_cache(tmp_path / "hub", "tiny-org/gpt2-tiny", src)
    use_hf_cache(monkeypatch, tmp_path / "hub")
    by_id = load_hf_causal_lm(repo="tiny-org/gpt2-tiny", length=3)
    assert by_id.grid == (1, 3)
    torch.testing.assert_close(by_id.teacher_force(by_id.make_prompt(["abc"]), tokens).logits, want)
    with pytest.raises(WeightsNotFoundError, match="tiny-org/absent-model"):
        load_model("hf:tiny-org/absent-model", device="cpu")
    with pytest.raises(UsageError):
        load_hf_causal_lm(repo="")


def test_read_prompts(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("  first prompt \n\n second\n   \n", encoding="utf-8")
    assert read_prompts(f) == ["first prompt", "second"]
    with pytest.raises(UsageError, match="does not exist"):
        read_prompts(tmp_path / "missing.txt")
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(UsageError, match="no prompts"):
        read_prompts(tmp_path / "blank.txt")


def test_bf16_draft_layer_keeps_the_targets_rotary_frequencies():
    """Casting the drafter layer to bf16 must not round its rotary inverse frequencies."""
    model, tok = tiny_llama()
    layer = HFCausalLM(model, tok).draft_layer().to(torch.bfloat16)
    rotary = layer._rotary[0]
    assert rotary.inv_freq.dtype == torch.float32
    torch.testing.assert_close(rotary.inv_freq, model.model.rotary_emb.inv_freq, atol=0, rtol=0)
    assert all(p.dtype == torch.bfloat16 for p in layer.parameters())
    x = torch.randn(1, 4, 32, generator=torch.Generator().manual_seed(5)).bfloat16()
    with torch.no_grad():
        assert torch.isfinite(layer(x, None, 6000).float()).all()
