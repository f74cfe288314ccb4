"""Anole / Chameleon / Lumina-mGPT adapter on a tiny random-weight transformers Chameleon (CPU, no network).

The tiny vocabulary has 16 image tokens at shuffled, non-contiguous ids, so any hard-coded offset
or code-order assumption would fail. The VQ tokenizer downsamples by 2: 8 px images, 4 x 4 tokens.
"""

import json
import random

import pytest
import torch
from reference.cache import OneImageCache
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import ChameleonConfig, ChameleonForConditionalGeneration

from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.generation import sample_tokens
from ambiguity.models.chameleon import (
    BOI,
    EOI,
    LUMINA_EOL,
    LUMINA_SEP,
    ChameleonModel,
    image_token_ids_from_vocab,
    load_chameleon,
    make_template,
)
from ambiguity.models.chameleon_vqgan import ChameleonVQGAN, vqgan_config_from_hf
from ambiguity.models.chameleon_weights import build_lm
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig, guide

V = 16
CODE_IDS = list(range(10, 10 + V))
random.Random(0).shuffle(CODE_IDS)  # vocabulary id of code c is CODE_IDS[c]


def imgimg(code: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def tiny_vocab() -> dict:
    vocab = {
        "<unk>": 0,
        "<s>": 1,
        "</s>": 2,
        "<pad>": 3,
        "<image>": 4,
        BOI: 5,
        EOI: 6,
        LUMINA_SEP: 7,
        LUMINA_EOL: 8,
        "<reserved08802>": 9,
    }  # 8 px / (2 * 2) = 2 -> Lumina's size token <reserved08802>
    vocab.update({imgimg(c): i for c, i in enumerate(CODE_IDS)})
    vocab.update({f"w{i}": i for i in range(26, 48)})
    return vocab


def tiny_config() -> ChameleonConfig:
    return ChameleonConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        vocabulary_map=tiny_vocab(),
        bos_token_id=1,
        vq_config=dict(
            embed_dim=8,
            num_embeddings=V,
            latent_channels=32,
            resolution=8,
            base_channels=32,
            channel_multiplier=[1, 2],
            num_res_blocks=1,
            attn_resolutions=[],
        ),
    )


def tiny_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.WordLevel(tiny_vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    model = ChameleonForConditionalGeneration(tiny_config()).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 1.0)  # well separated logits for greedy checks
        for layer in model.model.layers:  # q/k norms: random per dimension, shared by heads (one shard, as released)
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.copy_(1 + 0.5 * torch.randn(norm.weight.shape[1]).expand_as(norm.weight))
                norm.bias.copy_(0.5 * torch.randn(norm.bias.shape[1]).expand_as(norm.bias))
    return model


def adapter(lm, style="chameleon", vqgan=None) -> ChameleonModel:
    return ChameleonModel(
        lm,
        make_template(tiny_vocab(), 1, style, resolution=8, downsample=2),
        tiny_tokenizer(),
        vqgan=vqgan,
        name=f"tiny-{style}",
    )


def tokens(rows, n, seed=0):
    return torch.randint(0, V, (rows, n), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- vocabulary map
def test_image_token_map_from_vocabulary_names(lm):
    ids = image_token_ids_from_vocab(tiny_vocab())
    assert ids.tolist() == CODE_IDS
    assert imgimg(10) == "IMGIMGBAZ"
    bpe2img = lm.model.vocabulary_mapping.bpe2img  # transformers' own reading of the same names
    assert all(bpe2img[int(ids[c])] == c for c in range(V))
    model = adapter(lm)
    assert model.vocab_size == V and torch.equal(
        model.to_code_indices(model.to_vocab_ids(torch.arange(V))), torch.arange(V)
    )
    broken = {k: v for k, v in tiny_vocab().items() if k != imgimg(3)}
    with pytest.raises(UsageError, match="not 0..14"):
        image_token_ids_from_vocab(broken)
    with pytest.raises(UsageError, match="no IMGIMG"):
        image_token_ids_from_vocab({"<s>": 1})


# --------------------------------------------------------------------------- logits
def test_image_logits_are_finite_and_equal_hidden_times_head_rows(lm):
    model = adapter(lm)
    prompt = model.make_prompt(["w26 w27 w28"])
    step = OneImageCache(model, prompt, model.num_tokens).prefill()
    assert step.logits.shape == (1, 1, V) and step.logits.dtype == torch.float32
    assert torch.isfinite(step.logits).all()
    with torch.no_grad():
        hidden = lm.model(input_ids=prompt.inputs["ids"]).last_hidden_state[:, -1:]
        masked = lm(input_ids=prompt.inputs["ids"]).logits[:, -1:]
    torch.testing.assert_close(step.hidden, hidden, atol=1e-6, rtol=0)
    torch.testing.assert_close(step.logits, hidden @ lm.lm_head.weight[CODE_IDS].T, atol=1e-6, rtol=0)
    # transformers' forward suppresses image tokens, which is why the adapter computes them itself
    assert (masked[..., CODE_IDS] == torch.finfo(masked.dtype).min).all()
    assert torch.equal(model.output_embeddings(), lm.lm_head.weight[CODE_IDS])
    assert torch.equal(model.input_embeddings(), lm.model.embed_tokens.weight[CODE_IDS])
    assert torch.equal(
        model.embed(torch.tensor([[3, 0]])), lm.model.embed_tokens.weight[[CODE_IDS[3], CODE_IDS[0]]][None]
    )
    assert model.codebook().shape == (V, 8)


# --------------------------------------------------------------------------- prompts
def test_cfg_prompt_rows_follow_the_templates(lm):
    model = adapter(lm)
    p = model.make_prompt(["w26 w27", "w28"], guided=True)
    assert p.rows == 4 and p.batch_size == 2
    assert p.inputs["ids"].tolist() == [[1, 26, 27, 5], [3, 1, 28, 5], [3, 3, 1, 5], [3, 3, 1, 5]]
    assert p.inputs["mask"].tolist() == [[1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]]
    lumina = adapter(lm, "lumina")
    assert lumina.template.text == "Generate an image of 8x8 according to the following prompt:\n{caption}"
    p = lumina.make_prompt([[26, 27]], guided=True)
    assert p.inputs["ids"].tolist() == [[1, 26, 27, 7, 5, 9, 9], [3, 3, 3, 3, 5, 9, 9]]
    assert p.inputs["mask"].tolist() == [[1] * 7, [0, 0, 0, 0, 1, 1, 1]]
    with pytest.raises(UsageError):
        model.make_prompt([])
    with pytest.raises(UsageError, match="0..47"):
        model.make_prompt([[99]])


def test_left_padded_row_computes_what_it_computes_alone(lm):
    model = adapter(lm)
    both = model.make_prompt(["w26 w27 w28 w29"], guided=True)  # row 1: <s> <boi> left-padded by 4
    x = tokens(1, 5)
    guided_rows = model.teacher_force(both, torch.cat([x, x]))
    alone = ChameleonModel(lm, model.template, None, name="t")  # the unconditional prefix, unpadded
    from ambiguity.models.base import Prompt

    ids = torch.tensor([[1, 5]])
    solo = alone.teacher_force(Prompt({"ids": ids, "mask": torch.ones_like(ids)}, 1, False), x)
    torch.testing.assert_close(guided_rows.logits[1:], solo.logits, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- KV cache
@pytest.mark.parametrize("style", ["chameleon", "lumina"])
def test_prefill_and_chunked_extend_equal_teacher_force(lm, style):
    model = adapter(lm, style)
    prompt = model.make_prompt([[26, 27, 28], [29]], guided=True)
    x = tokens(2, 16, seed=1)
    rows = torch.cat([x, x])
    full = model.teacher_force(prompt, rows)
    cache = OneImageCache(model, prompt, model.num_tokens)
    parts = [cache.prefill()]
    for a, b in ((0, 1), (1, 4), (4, 9), (9, 15)):  # chunks crossing row ends (width 4)
        parts.append(cache.extend(rows[:, a:b]))
    logits = torch.cat([s.logits for s in parts], 1)
    hidden = torch.cat([s.hidden for s in parts], 1)
    assert logits.shape == (4, 16, V) and cache.n == 15
    torch.testing.assert_close(logits, full.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden, full.hidden, atol=1e-5, rtol=0)
    eol = 16 // 4 if style == "lumina" else 0  # the slots cache: prefix region, 16 slots and their separators
    assert cache.cache.kv.capacity == prompt.inputs["ids"].shape[1] + 16 + eol + 1  # + the scratch entry


def test_lumina_end_of_row_tokens_are_inserted_transparently(lm):
    model = adapter(lm, "lumina")
    prompt = model.make_prompt([[26, 27]])
    x = tokens(1, 6, seed=2)
    cache = OneImageCache(model, prompt, model.num_tokens)
    cache.prefill()
    step = cache.extend(x)
    v = [CODE_IDS[c] for c in x[0].tolist()]
    seq = prompt.inputs["ids"][0].tolist() + v[:4] + [8] + v[4:]  # 8 = <reserved08799> after the 4-token row
    with torch.no_grad():
        h = lm.model(input_ids=torch.tensor([seq])).last_hidden_state[0]
    P = prompt.inputs["ids"].shape[1]
    want = torch.stack([h[P + 0], h[P + 1], h[P + 2], h[P + 4], h[P + 5], h[P + 6]])  # token 3 -> output after EOL
    torch.testing.assert_close(step.hidden[0], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("style,keep", [("chameleon", 3), ("lumina", 4), ("lumina", 6), ("lumina", 0)])
def test_rollback_then_reextend_equals_a_fresh_run(lm, style, keep):
    model = adapter(lm, style)
    prompt = model.make_prompt([[26, 27]], guided=True)
    first, second = tokens(1, 10, seed=3), tokens(1, 5, seed=4)
    cache = OneImageCache(model, prompt, model.num_tokens)
    cache.prefill()
    cache.extend(torch.cat([first, first]))
    cache.rollback(keep)  # the rejected slots are never visible again, then overwritten
    assert cache.n == keep
    again = cache.extend(torch.cat([second, second]))
    fresh = OneImageCache(model, prompt, model.num_tokens)
    fresh.prefill()
    ref = fresh.extend(torch.cat([torch.cat([first[:, :keep], second], 1)] * 2))
    torch.testing.assert_close(again.logits, ref.logits[:, keep:], atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        cache.rollback(keep + 6)


# --------------------------------------------------------------------------- profile path and drafter
def test_sample_tokens_runs_and_greedy_tokens_are_guided_argmax(lm):
    model = adapter(lm)
    sampling = SamplingConfig(guidance=3.0, temperature=0.0)
    prompt = model.make_prompt(["w26 w27", "w30"], guided=True)
    seen = []
    out = sample_tokens(model, prompt, sampling, on_step=lambda t, logits, p, x: seen.append(float(p.sum(-1).min())))
    assert out.shape == (2, 16) and len(seen) == 16 and min(seen) > 0.999
    tf = model.teacher_force(prompt, torch.cat([out, out]))
    assert torch.equal(guide(tf.logits, 3.0, True).argmax(-1), out)
    hot = sample_tokens(
        model, model.make_prompt(["w26"]), SamplingConfig(temperature=1.0), generator=torch.Generator().manual_seed(0)
    )
    assert hot.shape == (1, 16) and 0 <= int(hot.min()) and int(hot.max()) < V


def test_draft_layer_cache_matches_a_full_forward(lm):
    model = adapter(lm)
    layer = model.draft_layer()
    assert not any(p is q for p in layer.parameters() for q in lm.parameters())
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = layer(x, None, 0)
        cache = layer.new_cache(2)
        a, b = layer(x[:, :3], cache, 0), layer(x[:, 3:], cache, 3)
        torch.testing.assert_close(torch.cat([a, b], 1), full, atol=1e-5, rtol=0)
        layer.rollback(cache, 2)
        c = layer(x[:, 2:], cache, 2)
    torch.testing.assert_close(c, full[:, 2:], atol=1e-5, rtol=0)
    assert full.shape == (2, 7, 32)


# --------------------------------------------------------------------------- checkpoints
def _vqgan_like(lm) -> ChameleonVQGAN:
    """A VQGAN whose encoder/codebook are the tiny model's vqmodel and whose decoder is random."""
    torch.manual_seed(7)
    vq = ChameleonVQGAN(vqgan_config_from_hf(lm.config.vq_config)).eval()
    missing = vq.load_state_dict(lm.model.vqmodel.state_dict(), strict=False).missing_keys
    assert missing and all(k.startswith("decoder.") for k in missing)
    return vq


def _save_hf(lm, path, with_decoder=None):
    path.mkdir(parents=True)
    lm.config.save_pretrained(path)
    state = {k: v.contiguous() for k, v in lm.state_dict().items()}
    if with_decoder is not None:
        state.update(
            {f"model.vqmodel.{k}": v for k, v in with_decoder.state_dict().items() if k.startswith("decoder.")}
        )
    save_file(state, str(path / "model.safetensors"))
    tiny_tokenizer().save(str(path / "tokenizer.json"))
    return path


def _hf_cache(tmp_path, monkeypatch, repo, files_from=None):
    import huggingface_hub.constants as hc

    cache = tmp_path / "hub"
    if files_from is not None:
        folder = cache / f"models--{repo.replace('/', '--')}"
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text("0" * 40)
        snap = folder / "snapshots" / ("0" * 40)
        snap.parent.mkdir(parents=True)
        files_from.rename(snap)
    cache.mkdir(exist_ok=True)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))


def test_saved_model_loads_from_weights_dir_and_from_the_hf_cache(lm, tmp_path, monkeypatch):
    vq = _vqgan_like(lm)
    d = _save_hf(lm, tmp_path / "ckpt", with_decoder=vq)
    ref = adapter(lm)
    prompt = ref.make_prompt(["w26 w27"], guided=True)
    x = tokens(2, 16, seed=6)
    want = ref.teacher_force(prompt, x).logits
    loaded = load_chameleon(weights=d, repo="leloy/Anole-7b-v0.1-hf", resolution=8)
    assert loaded.grid == (4, 4) and loaded.can_decode and loaded.image_shape == (3, 8, 8)
    torch.testing.assert_close(
        loaded.teacher_force(loaded.make_prompt(["w26 w27"], guided=True), x).logits, want, atol=1e-5, rtol=0
    )
    codes = tokens(2, 16, seed=8).view(2, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.decode_codes(codes), ((vq.decode_codes(codes) + 1) / 2).clamp(0, 1), atol=1e-6, rtol=0
        )
        images = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(9))
        assert torch.equal(
            loaded.encode_images(images), ref.encode_images(images)
        )  # our VQGAN == transformers' encoder
    _hf_cache(tmp_path, monkeypatch, "leloy/Anole-7b-v0.1-hf", files_from=_save_hf(lm, tmp_path / "plain"))
    cached = load_model("anole", device="cpu")  # registry -> catalog -> cached snapshot
    assert cached.name == "anole" and cached.grid == (256, 256) and not cached.can_decode
    torch.testing.assert_close(
        cached.teacher_force(cached.make_prompt(["w26 w27"], guided=True), x).logits, want, atol=1e-5, rtol=0
    )
    with pytest.raises(NotImplementedError, match="vqgan.ckpt"):
        cached.decode_codes(codes)


@pytest.mark.parametrize(
    "name,repo",
    [
        ("anole", "leloy/Anole-7b-v0.1-hf"),
        ("chameleon-7b", "facebook/chameleon-7b"),
        ("lumina-mgpt", "Alpha-VLLM/Lumina-mGPT-7B-768"),
    ],
)
def test_absent_weights_name_the_repo_to_download(tmp_path, monkeypatch, name, repo):
    _hf_cache(tmp_path, monkeypatch, repo)
    with pytest.raises(WeightsNotFoundError) as err:
        load_model(name, device="cpu")
    assert repo in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(WeightsNotFoundError, match=repo):
        load_model(name, weights=tmp_path / "nowhere", device="cpu")


def _unpermute(w, heads):
    rows, cols = w.shape
    return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def test_meta_release_layout_is_converted(lm, tmp_path):
    """GAIR/Anole-7b-v0.1 layout: models/7b/consolidated.pth + params.json, tokenizer/{text_tokenizer.json,
    vqgan.yaml, vqgan.ckpt}; built here by inverting transformers' conversion of the tiny model."""
    cfg, sd = lm.config, lm.state_dict()
    meta = {
        "tok_embeddings.weight": sd["model.embed_tokens.weight"],
        "norm.weight": sd["model.norm.weight"],
        "output.weight": sd["lm_head.weight"],
    }
    for i in range(cfg.num_hidden_layers):
        a, s = f"model.layers.{i}.self_attn.", f"layers.{i}."
        meta[s + "attention.wq.weight"] = _unpermute(sd[a + "q_proj.weight"], 4)
        meta[s + "attention.wk.weight"] = _unpermute(sd[a + "k_proj.weight"], 2)
        meta[s + "attention.wv.weight"], meta[s + "attention.wo.weight"] = (
            sd[a + "v_proj.weight"],
            sd[a + "o_proj.weight"],
        )
        for ours, theirs in (("q_norm", "q_normalization"), ("k_norm", "k_normalization")):
            for p in ("weight", "bias"):
                meta[f"{s}attention.{theirs}.{p}"] = sd[f"{a}{ours}.{p}"][0].view(2, -1).t().reshape(-1)
        m = f"model.layers.{i}."
        meta[s + "feed_forward.w1.weight"], meta[s + "feed_forward.w2.weight"] = (
            sd[m + "mlp.gate_proj.weight"],
            sd[m + "mlp.down_proj.weight"],
        )
        meta[s + "feed_forward.w3.weight"] = sd[m + "mlp.up_proj.weight"]
        meta[s + "attention_norm.weight"], meta[s + "ffn_norm.weight"] = (
            sd[m + "input_layernorm.weight"],
            sd[m + "post_attention_layernorm.weight"],
        )
    root = tmp_path / "Anole-7b-v0.1"
    (root / "models" / "7b").mkdir(parents=True)
    (root / "tokenizer").mkdir()
    torch.save({k: v.clone() for k, v in meta.items()}, root / "models" / "7b" / "consolidated.pth")
    (root / "models" / "7b" / "params.json").write_text(
        json.dumps(  # MLP width 32 * ceil(int(0.75 * 85) / 32) = 64
            {
                "model": {
                    "dim": 32,
                    "n_layers": 2,
                    "n_heads": 4,
                    "n_kv_heads": 2,
                    "norm_eps": 1e-5,
                    "rope_theta": 10000.0,
                    "swin_norm": False,
                    "multiple_of": 32,
                    "ffn_dim_multiplier": 0.75,
                },
                "model_parallel_size": 1,
            }
        )
    )
    tiny_tokenizer().save(str(root / "tokenizer" / "text_tokenizer.json"))
    (root / "tokenizer" / "vqgan.yaml").write_text(
        "model:\n  params:\n    embed_dim: 8\n    n_embed: 16\n    ddconfig:\n      double_z: false\n"
        "      z_channels: 32\n"
        "      resolution: 8\n      in_channels: 3\n      out_ch: 3\n      ch: 32\n      ch_mult: [1, 2]\n"
        "      num_res_blocks: 1\n      attn_resolutions: []\n      dropout: 0.0\n"
    )
    vq = _vqgan_like(lm)
    torch.save({"state_dict": vq.state_dict()}, root / "tokenizer" / "vqgan.ckpt")
    loaded = load_chameleon(weights=root, repo="GAIR/Anole-7b-v0.1", resolution=8)
    got = loaded.lm.state_dict()
    assert set(got) == set(sd) and all(torch.equal(got[k], sd[k]) for k in sd)
    ref = adapter(lm)
    x = tokens(2, 16, seed=10)
    torch.testing.assert_close(
        loaded.teacher_force(loaded.make_prompt(["w26 w40"], guided=True), x).logits,
        ref.teacher_force(ref.make_prompt(["w26 w40"], guided=True), x).logits,
        atol=1e-5,
        rtol=0,
    )
    assert loaded.can_decode and torch.equal(loaded.codebook(), vq.codebook())


def test_lumina_per_shard_qk_norms_are_expanded_per_head(lm):
    """Lumina-mGPT checkpoints store q/k-norm parameters as (model_parallel_size, head_dim) = (1, head_dim)."""
    state = {k: v.clone() for k, v in lm.state_dict().items()}
    for k in state:
        if ".q_norm." in k or ".k_norm." in k:
            state[k] = state[k][:1]
    new, vq_state = build_lm(lm.config, state, what="lumina")
    assert all(torch.equal(new.state_dict()[k], v) for k, v in lm.state_dict().items())
    assert set(vq_state) == {k[len("model.vqmodel.") :] for k in state if k.startswith("model.vqmodel.")}
    lumina = ChameleonModel(new, make_template(tiny_vocab(), 1, "lumina", 8, 2), None, name="lumina")
    prompt = lumina.make_prompt([[26]])
    assert torch.isfinite(OneImageCache(lumina, prompt, lumina.num_tokens).prefill().logits).all()
    state["model.layers.0.self_attn.q_norm.weight"] = state["model.layers.0.self_attn.q_norm.weight"][:, :3]
    with pytest.raises(UsageError, match="shape mismatch"):
        build_lm(lm.config, state)
