"""``hf:<repo>`` text adapter on tiny random Llama and GPT-2 causal LMs (offline, CPU)."""

import pytest
import torch
from hf_tiny import char_tokenizer, save, save_to_hf_cache, tiny_gpt2, tiny_llama, use_hf_cache
from reference.cache import OneImageCache

from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.generation import sample_tokens
from ambiguity.models.hf_text import HFCausalLM, load_hf_causal_lm, read_prompts
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig, distribution, pick
from ambiguity.seeding import image_generator
from lantern.engine.decode import DecodeConfig, decode

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
    cache = OneImageCache(lm, p, L)
    steps = [cache.prefill(), cache.extend(tokens[:, :2]), cache.extend(tokens[:, 2:5])]
    torch.testing.assert_close(torch.cat([s.logits for s in steps], 1), tf.logits, atol=1e-5, rtol=0)
    cache.rollback(1)
    cache.extend(torch.cat([tokens[:, 1:2], other[:, 2:4]], 1))  # one accepted, two rejected
    cache.rollback(2)
    torch.testing.assert_close(cache.extend(tokens[:, 2:5]).logits, tf.logits[:, 3:6], atol=1e-5, rtol=0)
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


# --------------------------------------------------------------------------- sliding-window attention
WINDOW_PROMPTS = ["hello there", "ab", "a longer prompt than the window"]


def _windowed(kind: str):
    """A tiny float64 text LM whose attention sees 3 positions: Mistral (every layer windowed) or Qwen 2
    (layer 0 full, layer 1 windowed: a decoder that takes one mask per layer type)."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tok = char_tokenizer([], bos="<s>", eos="</s>", pad="<pad>", prepend_bos=True)
    torch.manual_seed(0)
    size = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    size.update(intermediate_size=48, max_position_embeddings=256, vocab_size=len(tok))
    if kind == "mistral":
        model = MistralForCausalLM(MistralConfig(sliding_window=3, **size))
    else:
        cfg = Qwen2Config(use_sliding_window=True, sliding_window=3, max_window_layers=1, **size)
        assert cfg.layer_types == ["full_attention", "sliding_attention"]
        model = Qwen2ForCausalLM(cfg)
    return model.eval().double(), tok


def _ar_without_cache(model, lm, prompt: str, index: int, n: int) -> list[int]:
    """Plain AR sampling, one full forward (no cache) of the prompt and the tokens so far per token,
    drawing from image ``index``'s stream of seed 0 as the engine does."""
    ids = list(lm.make_prompt([prompt]).inputs["ids"][0].tolist())
    g, out = image_generator(0, index), []
    for _ in range(n):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids + out])).logits[:, -1].float()
        out.append(int(pick(distribution(logits, SamplingConfig()), False, [g])[0]))
    return out


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_sliding_window_decodes_on_the_engine_as_full_forwards_do(kind):
    """Sliding-window layers on the slots cache: the engine's AR decoding (batch 1 and a batch of 2
    with a prompt admitted later) and the profile's sampler give every prompt the tokens of plain AR
    sampling with full forwards, in float64; the window matters (a full-attention mask differs)."""
    model, tok = _windowed(kind)
    lm = HFCausalLM(model, tok, name=f"hf:tiny-{kind}", length=8)
    assert lm.can_batch_decode and lm.batch_limit == ""
    want = [_ar_without_cache(model, lm, p, i, 8) for i, p in enumerate(WINDOW_PROMPTS)]
    for B in (1, 2):
        got = decode(lm, WINDOW_PROMPTS, DecodeConfig.of("ar"), SamplingConfig(), batch_size=B).tokens
        assert got.tolist() == want, B
    from ambiguity.seeding import image_generators

    gens = image_generators(0, range(3))
    assert sample_tokens(lm, lm.make_prompt(WINDOW_PROMPTS), SamplingConfig(), gens).tolist() == want
    p = lm.make_prompt(WINDOW_PROMPTS[2:])
    codes = torch.tensor([want[2]])
    with torch.no_grad():
        ids = torch.cat([p.inputs["ids"], codes[:, :-1]], 1)
        windowed = model(input_ids=ids).logits[:, -8:].float()
    tf = lm.teacher_force(p, codes).logits
    torch.testing.assert_close(tf, windowed, atol=1e-10, rtol=0)
    cache = OneImageCache(lm, p, 8)
    steps = [cache.prefill(), cache.extend(codes[:, :3]), cache.extend(codes[:, 3:7])]
    torch.testing.assert_close(torch.cat([s.logits for s in steps], 1), windowed, atol=1e-10, rtol=0)
    lm._plan_of = (lm.decoder.config, "", (None, None))  # the same cache without the window
    full = OneImageCache(lm, p, 8)
    steps = [full.prefill(), full.extend(codes[:, :7])]
    assert (torch.cat([s.logits for s in steps], 1) - windowed).abs().max() > 1e-3
