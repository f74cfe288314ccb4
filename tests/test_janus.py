"""Janus / Janus-Pro adapter on a tiny random JanusForConditionalGeneration (offline, CPU)."""

import pytest
import torch
import torch.nn.functional as F
from hf_tiny import save, save_to_hf_cache, tiny_janus, use_hf_cache
from reference.cache import OneImageCache

from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.generation import sample_tokens
from ambiguity.models.hf_cache import new_dynamic_cache
from ambiguity.models.janus import JANUS_PRO_1B_REPO, JanusModel, load_janus
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig

CAPTIONS = ["a cat", "a big dog on grass"]


@pytest.fixture(scope="module")
def tiny():
    model, tok = tiny_janus()
    return model, tok, JanusModel(model, tok, name="janus-tiny")


def _codes(rows, n, V=24, seed=0):
    return torch.randint(0, V, (rows, n), generator=torch.Generator().manual_seed(seed))


def test_id_map_grid_and_shapes(tiny):
    model, _, jm = tiny
    assert jm.kind == "t2i" and jm.grid == (4, 4) and jm.num_tokens == 16
    # Janus's image vocabulary is the generation head's output space: id == code index
    assert torch.equal(jm.image_token_ids, torch.arange(24))
    assert model.model.generation_head.vision_head.out_features == jm.vocab_size == 24
    assert jm.image_shape == (3, 8, 8)
    assert jm.hidden_size == 32


def test_prompt_follows_janus_template_and_expand_rows(tiny):
    _, tok, jm = tiny
    p = jm.make_prompt(CAPTIONS, guided=True)
    assert p.rows == 4 and p.batch_size == 2 and p.conditions == CAPTIONS
    ids, mask = p.inputs["ids"], p.inputs["mask"]
    for i, cap in enumerate(CAPTIONS):
        want = tok(f"<s><|User|>: {cap}\n\n<|Assistant|>:<begin_of_image>", add_special_tokens=False)["input_ids"]
        n = len(want)
        assert int(mask[i].sum()) == n and mask[i, -n:].all() and not mask[i, :-n].any()
        assert ids[i, -n:].tolist() == want
        # unconditional row: BOS, pads (attended), <begin_of_image>
        u = ids[2 + i, -n:].tolist()
        assert u == [tok.bos_token_id] + [tok.pad_token_id] * (n - 2) + [tok.convert_tokens_to_ids("<begin_of_image>")]
        assert int(mask[2 + i].sum()) == n
    assert not jm.make_prompt(CAPTIONS).guided and jm.make_prompt(CAPTIONS).rows == 2


def test_logits_finite_and_equal_direct_computation(tiny):
    model, _, jm = tiny
    p = jm.make_prompt(["a cat"])
    tokens = _codes(1, 16)
    step = jm.teacher_force(p, tokens)
    assert step.logits.shape == (1, 16, 24) and step.logits.dtype == torch.float32
    assert torch.isfinite(step.logits).all()
    with torch.no_grad():
        embeds = torch.cat(
            [
                model.get_input_embeddings()(p.inputs["ids"]),
                model.prepare_embeddings_for_image_generation(tokens[:, :-1]),
            ],
            1,
        )
        h = model.model.language_model(inputs_embeds=embeds).last_hidden_state
        direct = model.model.generation_head(h[:, p.inputs["ids"].shape[1] - 1 :])
    torch.testing.assert_close(step.logits, direct, atol=1e-5, rtol=0)
    torch.testing.assert_close(step.hidden, h[:, p.inputs["ids"].shape[1] - 1 :], atol=1e-5, rtol=0)
    torch.testing.assert_close(jm.head(step.hidden), step.logits)


def test_prefill_extend_equals_teacher_force_with_cfg_and_padding(tiny):
    _, _, jm = tiny
    p = jm.make_prompt(CAPTIONS, guided=True)
    tokens = _codes(2, 16, seed=1).repeat(2, 1)
    tf = jm.teacher_force(p, tokens)
    cache = OneImageCache(jm, p, 16)
    steps = [cache.prefill(), cache.extend(tokens[:, :5]), cache.extend(tokens[:, 5:6]), cache.extend(tokens[:, 6:15])]
    assert cache.n == 15
    torch.testing.assert_close(torch.cat([s.logits for s in steps], 1), tf.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat([s.hidden for s in steps], 1), tf.hidden, atol=1e-5, rtol=0)


def test_rollback_then_reextend_equals_fresh_run(tiny):
    _, _, jm = tiny
    p = jm.make_prompt(CAPTIONS)
    tokens = _codes(2, 16, seed=2)
    other = _codes(2, 16, seed=3)
    cache = OneImageCache(jm, p, 16)
    cache.prefill()
    cache.extend(torch.cat([tokens[:, :6], other[:, 6:12]], 1))  # 6 accepted, 6 rejected drafts
    cache.rollback(6)
    assert cache.n == 6
    again = cache.extend(tokens[:, 6:10])
    fresh = jm.teacher_force(p, tokens[:, :11])
    torch.testing.assert_close(again.logits, fresh.logits[:, 7:11], atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        cache.rollback(11)


def test_expand_rows_equal_their_prompts_run_alone(tiny):
    model, tok, jm = tiny
    p = jm.make_prompt(CAPTIONS, guided=True)
    tokens = _codes(2, 6, seed=4).repeat(2, 1)
    batch = jm.teacher_force(p, tokens)
    # the unconditional row of caption 0, run alone and unpadded
    ids = jm.unconditional_ids(jm.prompt_ids(CAPTIONS[0]))
    with torch.no_grad():
        embeds = torch.cat(
            [
                model.get_input_embeddings()(torch.tensor([ids])),
                model.prepare_embeddings_for_image_generation(tokens[2:3, :-1]),
            ],
            1,
        )
        h = model.model.language_model(inputs_embeds=embeds).last_hidden_state[:, len(ids) - 1 :]
    torch.testing.assert_close(batch.logits[2:3], jm.head(h), atol=1e-5, rtol=0)
    alone = jm.teacher_force(jm.make_prompt(CAPTIONS[:1]), tokens[:1])
    torch.testing.assert_close(batch.logits[:1], alone.logits, atol=1e-5, rtol=0)
    assert not torch.allclose(batch.logits[0], batch.logits[2])  # the prompt matters


def test_greedy_sampling_matches_janus_generation_loop(tiny):
    """sample_tokens (the profile path) = Janus's own loop: gen_head, CFG on logits, gen embeddings."""
    model, _, jm = tiny
    scale = 5.0
    p = jm.make_prompt(["a cat"], guided=True)
    out = sample_tokens(jm, p, SamplingConfig(guidance=scale, temperature=0.0))
    assert out.shape == (1, 16)
    ids = torch.tensor([jm.prompt_ids("a cat"), jm.unconditional_ids(jm.prompt_ids("a cat"))])
    embeds, kv, want = model.get_input_embeddings()(ids), new_dynamic_cache(), []
    with torch.no_grad():
        for _ in range(16):
            h = model.model.language_model(inputs_embeds=embeds, cache=kv, use_cache=True).last_hidden_state[:, -1]
            logits = model.model.generation_head(h)
            guided = logits[1] + scale * (logits[0] - logits[1])
            nxt = guided.argmax()
            want.append(int(nxt))
            embeds = model.prepare_embeddings_for_image_generation(nxt.repeat(2)[:, None])
    assert out[0].tolist() == want
    sampled = sample_tokens(jm, jm.make_prompt(CAPTIONS), SamplingConfig(), generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (2, 16) and 0 <= int(sampled.min()) and int(sampled.max()) < 24


def test_codebook_decode_and_encode(tiny):
    model, _, jm = tiny
    cb = jm.codebook()
    assert cb.shape == (24, 4)
    torch.testing.assert_close(cb.norm(dim=-1), torch.ones(24))
    codes = _codes(2, 16, seed=5).view(2, 4, 4)
    img = jm.decode_codes(codes)
    assert img.shape == (2, 3, 8, 8) and 0 <= float(img.min()) and float(img.max()) <= 1
    with torch.no_grad():
        ref = model.decode_image_tokens(codes.view(2, -1)).permute(0, 3, 1, 2)
    torch.testing.assert_close(img, ((ref + 1) / 2).clamp(0, 1))
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    got = jm.encode_images(x)
    vq = model.model.vqmodel
    with torch.no_grad():
        z = F.normalize(vq.quant_conv(vq.encoder(x * 2 - 1)).permute(0, 2, 3, 1), dim=-1)
    dist = ((z[..., None, :] - cb) ** 2).sum(-1)
    assert got.shape == (2, 4, 4) and torch.equal(got, dist.argmin(-1))
    assert jm.input_embeddings().shape == (24, 32) and jm.output_embeddings().shape == (24, 32)


def test_draft_layer_chunked_forward_equals_full(tiny):
    _, _, jm = tiny
    layer = jm.draft_layer()
    assert type(layer.layer).__name__ == "LlamaDecoderLayer"
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = layer(x, None, 0)
        cache = layer.new_cache(2)
        parts = [layer(x[:, :3], cache, 0), layer(x[:, 3:4], cache, 3), layer(x[:, 4:], cache, 4)]
        torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)
        layer.rollback(cache, 4)
        torch.testing.assert_close(layer(x[:, 4:7], cache, 4), full[:, 4:7], atol=1e-5, rtol=0)
        assert not torch.allclose(layer(x[:, 4:7], None, 4), full[:, 4:7], atol=1e-4)  # context matters


def test_load_from_path_and_hf_cache(tiny, tmp_path, monkeypatch):
    model, tok, jm = tiny
    src = save(model, tok, tmp_path / "janus")
    p_tokens = _codes(1, 5, seed=6)
    want = jm.teacher_force(jm.make_prompt(["a cat"]), p_tokens).logits
    by_path = load_janus(weights=src)
    torch.testing.assert_close(by_path.teacher_force(by_path.make_prompt(["a cat"]), p_tokens).logits, want)
    cache = tmp_path / "hub"
    save_to_hf_cache(cache, JANUS_PRO_1B_REPO, src)
    use_hf_cache(monkeypatch, cache)
    by_name = load_model("janus-pro-1b", device="cpu")
    assert by_name.name == "janus-pro-1b" and isinstance(by_name, JanusModel)
    torch.testing.assert_close(by_name.teacher_force(by_name.make_prompt(["a cat"]), p_tokens).logits, want)


def test_absent_weights_name_the_repo(tmp_path, monkeypatch):
    use_hf_cache(monkeypatch, tmp_path / "empty")
    with pytest.raises(WeightsNotFoundError, match="deepseek-community/Janus-Pro-7B"):
        load_model("janus-pro-7b", device="cpu")
    with pytest.raises(WeightsNotFoundError, match="Janus-Pro-1B"):
        load_janus(weights=tmp_path / "nothing-here")


def test_bad_conditions_are_usage_errors(tiny):
    _, _, jm = tiny
    with pytest.raises(UsageError):
        jm.make_prompt([])
    with pytest.raises(UsageError):
        jm.make_prompt(torch.zeros(2, 3))
    with pytest.raises(UsageError):
        jm.make_prompt([3, 4])
