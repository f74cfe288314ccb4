"""Emu3 adapter on a tiny random Emu3ForConditionalGeneration (offline, CPU).

The tiny vocabulary lists its 20 visual tokens in shuffled order with special tokens between
them, so an offset-based map would fail. The grid is 3 x 4 (rows of 4 codes + end-of-row).
"""

import pytest
import torch
from hf_tiny import save, save_to_hf_cache, tiny_emu3, use_hf_cache
from reference.cache import OneImageCache

from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.generation import sample_tokens
from ambiguity.models.emu3 import EMU3_GEN_REPO, Emu3Model, emu3_grid, load_emu3, visual_token_ids
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig

CAPTIONS = ["a cat", "a big dog on grass"]
V, H, W = 20, 3, 4


@pytest.fixture(scope="module")
def tiny():
    model, tok = tiny_emu3(codebook=V)
    return model, tok, Emu3Model(model, tok, name="emu3-tiny", grid=(H, W), negative_prompt="ugly")


def _codes(rows, n, seed=0):
    return torch.randint(0, V, (rows, n), generator=torch.Generator().manual_seed(seed))


def _with_eol(jm, tokens):
    """Vocabulary ids of codes (rows, T) from image position 0 with an end-of-row after each row."""
    out, pick = [], []
    for i in range(tokens.shape[1]):
        out.append(jm.image_token_ids[tokens[:, i]])
        if (i + 1) % W == 0:
            out.append(torch.full((tokens.shape[0],), jm.eol_id))
        pick.append(len(out) - 1)
    return torch.stack(out, 1), pick


def test_id_map_from_vocabulary(tiny):
    _, tok, em = tiny
    want = [tok.convert_tokens_to_ids(f"<|visual token{c:06d}|>") for c in range(V)]
    assert em.image_token_ids.tolist() == want
    assert want != list(range(want[0], want[0] + V))  # not an offset in this vocabulary
    assert em.eol_id == tok.convert_tokens_to_ids("<|extra_200|>")
    assert torch.equal(em.to_code_indices(em.to_vocab_ids(torch.arange(V))), torch.arange(V))
    with pytest.raises(ValueError):
        em.to_code_indices(torch.tensor([em.eol_id]))
    with pytest.raises(UsageError, match="visual tokens"):
        visual_token_ids({"<|visual token000000|>": 5, "<|visual token000002|>": 6}, 3)


def test_grid_from_ratio_and_area():
    assert emu3_grid() == (90, 90)  # Emu3's 720 x 720 default
    assert emu3_grid("16:9", 518400, 8) == (68, 120)
    assert emu3_grid("4:3", 12 * 16, 4) == (3, 4)
    with pytest.raises(UsageError):
        emu3_grid("square", 518400)


def test_prompt_template_and_negative_prompt_rows(tiny):
    _, tok, em = tiny
    p = em.make_prompt(CAPTIONS, guided=True)
    ids, mask = p.inputs["ids"], p.inputs["mask"]
    for i, text in enumerate(CAPTIONS + ["ugly", "ugly"]):
        want = tok(f"<|extra_203|>{text}<|image start|>3*4<|image token|>", add_special_tokens=False)["input_ids"]
        assert ids[i, -len(want) :].tolist() == want and int(mask[i].sum()) == len(want)
    assert em.image_shape == (3, 12, 16)


def test_logits_equal_direct_computation_across_row_ends(tiny):
    model, _, em = tiny
    p = em.make_prompt(["a cat"])
    tokens = _codes(1, H * W, seed=1)
    step = em.teacher_force(p, tokens)
    assert step.logits.shape == (1, H * W, V) and torch.isfinite(step.logits).all()
    seq, pick = _with_eol(em, tokens[:, :-1])
    P = p.inputs["ids"].shape[1]
    with torch.no_grad():
        full = model(input_ids=torch.cat([p.inputs["ids"], seq], 1)).logits  # all vocabulary ids
    rows = [P - 1] + [P + j for j in pick]
    torch.testing.assert_close(step.logits, full[:, rows][..., em.image_token_ids], atol=1e-5, rtol=0)


def test_prefill_extend_equals_teacher_force(tiny):
    _, _, em = tiny
    p = em.make_prompt(CAPTIONS, guided=True)
    tokens = _codes(2, H * W, seed=2).repeat(2, 1)
    tf = em.teacher_force(p, tokens)
    cache = OneImageCache(em, p, em.num_tokens)
    steps = [
        cache.prefill(),
        cache.extend(tokens[:, :3]),
        cache.extend(tokens[:, 3:4]),
        cache.extend(tokens[:, 4:9]),
        cache.extend(tokens[:, 9:11]),
    ]
    assert cache.n == 11
    torch.testing.assert_close(torch.cat([s.logits for s in steps], 1), tf.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat([s.hidden for s in steps], 1), tf.hidden, atol=1e-5, rtol=0)


@pytest.mark.parametrize("keep", [3, 4, 5, 8])
def test_rollback_across_row_end_then_reextend_equals_fresh(tiny, keep):
    _, _, em = tiny
    p = em.make_prompt(CAPTIONS)
    tokens, other = _codes(2, H * W, seed=3), _codes(2, H * W, seed=4)
    cache = OneImageCache(em, p, em.num_tokens)
    cache.prefill()
    cache.extend(torch.cat([tokens[:, :keep], other[:, keep:10]], 1))
    cache.rollback(keep)  # the rejected slots and their end-of-row tokens are never visible again
    again = cache.extend(tokens[:, keep:11])
    fresh = em.teacher_force(p, tokens)
    torch.testing.assert_close(again.logits, fresh.logits[:, keep + 1 : 12], atol=1e-5, rtol=0)


def test_expand_rows_equal_the_negative_prompt_alone(tiny):
    model, _, em = tiny
    p = em.make_prompt(CAPTIONS, guided=True)
    tokens = _codes(2, 7, seed=5).repeat(2, 1)
    batch = em.teacher_force(p, tokens)
    neg = torch.tensor([em.prompt_ids("ugly")])
    seq, pick = _with_eol(em, tokens[3:4, :-1])
    with torch.no_grad():
        full = model(input_ids=torch.cat([neg, seq], 1)).logits
    rows = [neg.shape[1] - 1] + [neg.shape[1] + j for j in pick]
    torch.testing.assert_close(batch.logits[3:4], full[:, rows][..., em.image_token_ids], atol=1e-5, rtol=0)
    assert not torch.allclose(batch.logits[1], batch.logits[3])


def test_greedy_sampling_matches_a_plain_full_sequence_loop(tiny):
    """sample_tokens through the cache = argmax of guided logits recomputed on the whole sequence."""
    model, _, em = tiny
    scale = 3.0
    out = sample_tokens(em, em.make_prompt(["a cat"], guided=True), SamplingConfig(guidance=scale, temperature=0.0))
    seqs = [torch.tensor(em.prompt_ids("a cat")), torch.tensor(em.prompt_ids("ugly"))]
    want = []
    with torch.no_grad():
        for t in range(H * W):
            logits = [model(input_ids=s[None]).logits[0, -1, em.image_token_ids] for s in seqs]
            code = int((logits[1] + scale * (logits[0] - logits[1])).argmax())
            want.append(code)
            extra = [em.image_token_ids[code]] + ([torch.tensor(em.eol_id)] if (t + 1) % W == 0 else [])
            seqs = [torch.cat([s, torch.stack(extra)]) for s in seqs]
    assert out[0].tolist() == want
    sampled = sample_tokens(
        em, em.make_prompt(CAPTIONS), SamplingConfig(top_k=5), generator=torch.Generator().manual_seed(0)
    )
    assert sampled.shape == (2, H * W)


def test_decode_matches_emu3_decode_image_tokens(tiny):
    model, _, em = tiny
    codes = _codes(2, H * W, seed=6)
    img = em.decode_codes(codes.view(2, H, W))
    assert img.shape == (2, 3, 12, 16) and 0 <= float(img.min()) and float(img.max()) <= 1
    seq, _ = _with_eol(em, codes)
    tail = torch.full((2, 3), em.eol_id)  # EOF, EOI, EOS after the image (dropped)
    with torch.no_grad():
        ref = model.decode_image_tokens(image_tokens=torch.cat([seq, tail], 1), height=H, width=W)
    torch.testing.assert_close(img, (ref * 0.5 + 0.5).clamp(0, 1))
    enc = em.encode_images(torch.rand(2, 3, 12, 16, generator=torch.Generator().manual_seed(0)))
    assert enc.shape == (2, H, W) and enc.dtype == torch.long and int(enc.max()) < V
    assert em.codebook().shape == (V, 4)
    assert em.input_embeddings().shape == (V, 32) and em.output_embeddings().shape == (V, 32)


def test_draft_layer_chunked_forward_equals_full(tiny):
    _, _, em = tiny
    layer = em.draft_layer()
    assert type(layer.layer).__name__ == "Emu3DecoderLayer"
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = layer(x, None, 0)
        cache = layer.new_cache(2)
        parts = [layer(x[:, :2], cache, 0), layer(x[:, 2:], cache, 2)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


def test_load_from_path_and_hf_cache(tiny, tmp_path, monkeypatch):
    model, tok, em = tiny
    src = save(model, tok, tmp_path / "emu3")
    tokens = _codes(1, 6, seed=7)
    want = em.teacher_force(em.make_prompt(["a cat"]), tokens).logits
    by_path = load_emu3(weights=src, ratio="4:3", image_area=12 * 16, negative_prompt="ugly")
    assert by_path.grid == (H, W)
    torch.testing.assert_close(by_path.teacher_force(by_path.make_prompt(["a cat"]), tokens).logits, want)
    save_to_hf_cache(tmp_path / "hub", EMU3_GEN_REPO, src)
    use_hf_cache(monkeypatch, tmp_path / "hub")
    by_name = load_model("emu3-gen", device="cpu")
    assert by_name.name == "emu3-gen" and by_name.grid == (180, 180)  # 720 px through the tiny VQ's factor 4


def test_absent_weights_name_the_repo(tmp_path, monkeypatch):
    use_hf_cache(monkeypatch, tmp_path / "empty")
    with pytest.raises(WeightsNotFoundError, match="BAAI/Emu3-Gen-hf"):
        load_model("emu3-gen", device="cpu")


def test_weights_that_cannot_fit_are_refused_before_loading(tiny, tmp_path, monkeypatch):
    """The weights are counted at the dtype they load in (from the safetensors headers, bf16 on disk
    -> fp32 on a CPU: twice the file) and refused with one line before from_pretrained runs."""
    from transformers import Emu3ForConditionalGeneration

    import ambiguity.memory as mem

    model, tok, _ = tiny
    src = save(model.to(torch.bfloat16), tok, tmp_path / "emu3")
    model.float()
    shards = sorted(src.glob("*.safetensors"))
    from safetensors.torch import load_file

    stored = [t for f in shards for t in load_file(f).values()]
    need32, n = mem.checkpoint_bytes(shards, torch.float32)
    need16, _ = mem.checkpoint_bytes(shards, torch.bfloat16)
    assert n == sum(t.numel() for t in stored)
    assert need32 == sum(t.numel() * (4 if t.is_floating_point() else t.element_size()) for t in stored)
    assert (
        need16
        == sum(t.numel() * t.element_size() for t in stored)
        == sum(f.stat().st_size for f in shards) - sum(8 + int.from_bytes(f.read_bytes()[:8], "little") for f in shards)
    )  # the file minus its header
    monkeypatch.setattr(mem, "available_bytes", lambda device=None: int(need32 / mem.SHARE) - 1)

    def never(*a, **k):
        raise AssertionError("from_pretrained ran although the weights cannot fit")

    monkeypatch.setattr(Emu3ForConditionalGeneration, "from_pretrained", never)
    with pytest.raises(UsageError) as err:
        load_emu3(weights=src, ratio="4:3", image_area=12 * 16, dtype=torch.float32)
    msg = str(err.value)
    assert "\n" not in msg and "at float32" in msg and "use --dtype bfloat16" in msg and "of memory available" in msg


def test_trees_are_refused_for_end_of_row_layouts_before_any_weights(tmp_path, monkeypatch, capsys):
    """Emu3 and Lumina-mGPT interleave end-of-row tokens, which draft trees do not model: generate
    refuses --tree from the registry, before it looks for the (absent) weights."""
    from lantern.generate import main

    use_hf_cache(monkeypatch, tmp_path / "empty")
    for model in ("emu3-gen", "lumina-mgpt"):
        assert main(["--model", model, "--method", "lantern", "--tree", "dynamic", "--out", str(tmp_path / model)]) == 2
        err = capsys.readouterr().err.strip()
        assert (
            err == f"error: {model} inserts end-of-row tokens, which draft trees do not model yet; use chain "
            f"drafting (--tree chain)"
        )
    assert main(["--model", "emu3-gen", "--method", "sd", "--out", str(tmp_path / "chain")]) == 2
    assert "not in the local Hugging Face cache" in capsys.readouterr().err  # a chain gets as far as the weights
