"""T5 caption encoder (LlamaGen t2i) on a tiny random T5 saved locally (offline, CPU)."""

import pytest
import torch
from hf_tiny import save, save_to_hf_cache, tiny_t5, use_hf_cache

from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.generation import sample_tokens
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.llamagen import LlamaGenModel
from ambiguity.models.text_encoders import T5_REPO, T5CaptionEncoder, clean_caption
from ambiguity.sampling import SamplingConfig


@pytest.mark.parametrize(
    "raw, clean",
    [
        ("A photo of a Cat,sitting on https://x.com/a", "a photo of a cat, sitting on"),
        ('  "A red\u2014blue   CAR."  ', "a red-blue car."),
        ("my-cute-little-cat_photo", "my cute little cat photo"),
        ("image.jpg of a dog @bob", "of a dog"),
        ("a+b 1920x1080 wallpaper", "a b wallpaper"),
        ("Tom &amp; Jerry <b>bold</b>", "tom ; jerry bold"),
        ("\u201cquoted\u201d \u4e2d\u6587 text", '"quoted" text'),  # curly -> straight quotes, CJK removed
    ],
)
def test_clean_caption(raw, clean):
    assert clean_caption(raw) == clean


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    model, tok = tiny_t5()
    return save(model, tok, tmp_path_factory.mktemp("t5") / "flan-t5-tiny"), model, tok


def test_features_mask_and_padding(t5_dir):
    path, model, tok = t5_dir
    enc = T5CaptionEncoder(str(path), max_length=12)
    assert enc.dim == 16
    feats, mask = enc.encode(["A Cat", "a dog on the grass, at night"])
    assert feats.shape == (2, 12, 16) and mask.dtype == torch.bool
    # "a cat" -> 5 characters + </s>; the long caption is truncated to 12 tokens
    assert mask.sum(1).tolist() == [6, 12] and mask[0, :6].all() and not mask[0, 6:].any()
    ids, m = enc.tokenize(["A Cat"])
    assert ids[0, :6].tolist() == tok("a cat")["input_ids"] and ids[0, 5] == tok.eos_token_id
    assert (ids[0, 6:] == tok.pad_token_id).all()
    with torch.no_grad():
        direct = model(input_ids=ids, attention_mask=m).last_hidden_state
    torch.testing.assert_close(feats[:1], direct)
    with pytest.raises(UsageError):
        enc.encode([])


def test_loads_lazily_from_the_hf_cache_and_dtype(t5_dir, tmp_path, monkeypatch):
    path, model, _ = t5_dir
    save_to_hf_cache(tmp_path / "hub", T5_REPO, path)
    use_hf_cache(monkeypatch, tmp_path / "hub")
    enc = T5CaptionEncoder(lazy=True, dtype=torch.bfloat16)
    assert enc.model is None
    feats, mask = enc.encode(["a cat"])
    assert feats.dtype == torch.bfloat16 and feats.shape == (1, 120, 16) and int(mask.sum()) == 6
    ref, _ = T5CaptionEncoder(str(path)).encode(["a cat"])
    torch.testing.assert_close(feats.float(), ref, atol=0.1, rtol=0.05)  # bf16 encoder vs fp32


def test_absent_weights_name_the_repo(tmp_path, monkeypatch):
    use_hf_cache(monkeypatch, tmp_path / "empty")
    enc = T5CaptionEncoder(lazy=True)
    with pytest.raises(WeightsNotFoundError, match="google/flan-t5-xl"):
        enc.encode(["a cat"])


def test_llamagen_t2i_prompt_from_captions(t5_dir):
    """The encoder feeds LlamaGen t2i: 120 caption tokens, padding moved to the front and zeroed."""
    path, _, _ = t5_dir
    torch.manual_seed(0)
    gpt = GPT(
        GPTConfig(
            dim=32,
            n_layer=1,
            n_head=2,
            vocab_size=64,
            block_size=16,
            model_type="t2i",
            caption_dim=16,
            cls_token_num=120,
            multiple_of=32,
        )
    ).eval()
    enc = T5CaptionEncoder(str(path))
    model = LlamaGenModel(gpt, caption_encoder=enc)
    p = model.make_prompt(["a cat", "a dog"], guided=True)
    cond, mask = p.inputs["cond"], p.inputs["mask"]
    assert cond.shape == (4, 120, 16) and mask.shape == (4, 120)
    feats, m = enc.encode(["a cat"])
    torch.testing.assert_close(cond[0, -6:], feats[0, :6])
    assert (cond[0, :-6] == 0).all() and mask[0, -6:].all() and not mask[0, :-6].any()
    out = sample_tokens(model, p, SamplingConfig(guidance=4.0), generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 16)
