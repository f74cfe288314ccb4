"""Tiny random-weight transformers models and tokenizers for the offline adapter tests.

Sizes follow the model testers of transformers (tests/models/*/test_modeling_*.py): a few
thousand to a few hundred thousand parameters, built from configs, no download.
"""

from __future__ import annotations

import shutil
import string
from pathlib import Path

import torch

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def char_tokenizer(
    specials: list[str],
    bos: str | None = "<s>",
    eos: str | None = None,
    pad: str = "<pad>",
    append_eos: bool = False,
    prepend_bos: bool = False,
):
    """A character-level fast tokenizer: ``<unk>``, the special tokens in the given order, then
    printable ASCII characters. Special strings are single tokens."""
    from tokenizers import Regex, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Split
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0}
    named = [t for t in (bos, eos, pad) if t]
    for tok in named + list(specials):
        vocab.setdefault(tok, len(vocab))
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Split(Regex("[\\s\\S]"), "isolated")
    if append_eos and eos:
        tok.post_processor = TemplateProcessing(single=f"$A {eos}", special_tokens=[(eos, vocab[eos])])
    if prepend_bos and bos:
        tok.post_processor = TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    extra = [t for t in specials if t not in named]
    kwargs = dict(unk_token="<unk>", pad_token=pad)
    if bos:
        kwargs["bos_token"] = bos
    if eos:
        kwargs["eos_token"] = eos
    return PreTrainedTokenizerFast(tokenizer_object=tok, additional_special_tokens=extra, **kwargs)


def save_to_hf_cache(cache_dir: Path, repo_id: str, src: Path) -> Path:
    """Copy a saved model directory into huggingface_hub's cache layout under ``cache_dir``."""
    root = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    snap = root / "snapshots" / COMMIT
    shutil.copytree(src, snap)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snap


def use_hf_cache(monkeypatch, cache_dir: Path) -> None:
    """Point huggingface_hub at ``cache_dir`` (offline) for the rest of a test."""
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_HUB_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache_dir))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True, raising=False)


def tiny_janus(seed: int = 0):
    """(JanusForConditionalGeneration, tokenizer): Llama 2x32, 24 codes, 4x4 grid, 8x8 px images."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    tok = char_tokenizer(["<begin_of_image>", "<end_of_image>"], bos="<s>", pad="<pad>")
    torch.manual_seed(seed)
    cfg = JanusConfig(
        text_config=dict(
            model_type="llama",
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            max_position_embeddings=256,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
        ),
        vision_config=dict(
            image_size=16,
            patch_size=4,
            hidden_size=16,
            projection_dim=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            mlp_ratio=2,
            num_image_tokens=16,
        ),
        vq_config=dict(
            embed_dim=4,
            num_embeddings=24,
            latent_channels=8,
            base_channels=32,
            channel_multiplier=[1, 1],
            num_res_blocks=1,
            projection_dim=32,
            image_token_embed_dim=32,
        ),
        image_token_id=tok.unk_token_id,
    )
    model = JanusForConditionalGeneration(cfg).eval()
    return model, tok


def emu3_tokenizer(codebook: int = 20, seed: int = 0):
    """A tokenizer with Emu3's special tokens and ``codebook`` visual tokens in shuffled id order."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(codebook, generator=g).tolist()
    visual = [f"<|visual token{c:06d}|>" for c in order]
    specials = ["<|image start|>", "<|image end|>", "<|image token|>", "<|extra_200|>", "<|extra_201|>", "<image>"]
    # interleave some visual tokens between the specials so the map cannot be an offset
    return char_tokenizer(
        visual[:5] + specials + visual[5:], bos="<|extra_203|>", eos="<|extra_204|>", pad="<|endoftext|>"
    )


def tiny_emu3(seed: int = 0, codebook: int = 20):
    """(Emu3ForConditionalGeneration, tokenizer): 2x32 decoder, ``codebook`` codes, VQ with factor 4."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    tok = emu3_tokenizer(codebook, seed)
    torch.manual_seed(seed)
    text = dict(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    vq = dict(
        codebook_size=codebook,
        embed_dim=4,
        latent_channels=4,
        temporal_downsample_factor=1,
        base_channels=32,
        channel_multiplier=[1, 2, 1],
        num_res_blocks=1,
        hidden_size=32,
        attn_resolutions=[],
    )
    cfg = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=dict(tok.get_vocab()))
    model = Emu3ForConditionalGeneration(cfg).eval()
    return model, tok


def tiny_llama(seed: int = 0):
    """(LlamaForCausalLM, tokenizer) with 2 layers of width 32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = char_tokenizer([], bos="<s>", eos="</s>", pad="<pad>", prepend_bos=True)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return LlamaForCausalLM(cfg).eval(), tok


def tiny_gpt2(seed: int = 0):
    """(GPT2LMHeadModel, tokenizer) with 2 layers of width 32 and no BOS token (like GPT-2)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = char_tokenizer([], bos=None, eos="<|endoftext|>", pad="<|endoftext|>")
    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=128,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return GPT2LMHeadModel(cfg).eval(), tok


def tiny_t5(seed: int = 0):
    """(T5EncoderModel, tokenizer) with d_model 16 and an EOS-appending tokenizer (like T5's)."""
    from transformers import T5Config, T5EncoderModel

    tok = char_tokenizer([], bos=None, eos="</s>", pad="<pad>", append_eos=True)
    torch.manual_seed(seed)
    cfg = T5Config(
        vocab_size=len(tok),
        d_model=16,
        d_kv=4,
        d_ff=32,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        feed_forward_proj="gated-gelu",
    )
    return T5EncoderModel(cfg).eval(), tok


def save(model, tok, path: Path) -> Path:
    """save_pretrained model and tokenizer into ``path``."""
    path = Path(path)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
