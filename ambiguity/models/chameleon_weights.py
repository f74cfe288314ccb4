"""Reading Chameleon-family checkpoints into transformers' ``ChameleonForConditionalGeneration``.

Two layouts, found from ``--weights`` or the local Hugging Face cache (never the network):

* transformers (``config.json`` + ``*.safetensors`` / ``pytorch_model*.bin``):
  ``leloy/Anole-7b-v0.1-hf``, ``facebook/chameleon-7b`` and Lumina-mGPT
  (``Alpha-VLLM/Lumina-mGPT-7B-*``). Lumina-mGPT's ``ChameleonXLLMX`` class stores each q/k-norm
  parameter once per model-parallel shard, (mp, head_dim), and repeats it over the shard's heads
  when it runs; :func:`build_lm` does that repetition once at load time.
* Meta's release (``GAIR/Anole-7b-v0.1``): ``models/7b/consolidated.pth`` + ``params.json``
  (+ ``consolidate_params.json``), ``tokenizer/text_tokenizer.json``, ``tokenizer/vqgan.{ckpt,yaml}``.
  :func:`convert_meta_state` renames the keys and converts the rotary layout in memory: Meta's
  rotary embedding rotates interleaved pairs (0,1), (2,3), ... of each head while transformers'
  rotates the halves (i, i + d/2), so the rows of wq/wk are permuted per head, and the q/k-norm
  parameters (one (head_dim,) vector, applied before the rotation) get the same permutation and
  one row per head. The formulas are those of transformers' ``convert_chameleon_weights_to_hf.py``.
  Only single-file (7B) checkpoints are supported.

Source: Chameleon Team, arXiv 2405.09818 (architecture: QK-norm, 65536-token vocabulary).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import torch

from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.models.chameleon_vqgan import vqgan_config_from_official
from ambiguity.models.checkpoints import load_checkpoint_state
from ambiguity.models.hub import download_hint

__all__ = ["checkpoint_layout", "read_checkpoint", "convert_meta_state", "build_lm", "locate_checkpoint"]


def _hf_state(root: Path, device) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    index = root / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.is_file()
        else sorted(p.name for p in root.glob("*.safetensors"))
    )
    state: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(root / name), framework="pt", device=str(device)) as f:
            for k in f.keys():
                state[k] = f.get_tensor(k)
    if not state:
        for p in sorted(root.glob("pytorch_model*.bin")):
            state.update(torch.load(p, map_location="cpu", weights_only=True, mmap=True))
    if not state:
        raise UsageError(
            f"{root} holds config.json but no *.safetensors or pytorch_model*.bin weights; finish the download"
        )
    return state


def _permute_rotary(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of q/k projections from interleaved (Meta) to half-split (transformers) rotary order."""
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _norm_rows(v: torch.Tensor, heads: int) -> torch.Tensor:
    """A Meta q/k-norm parameter (head_dim,) -> (heads, head_dim) in half-split rotary order."""
    return v.view(-1, 2).t().reshape(1, -1).repeat_interleave(heads, 0)


def convert_meta_state(loaded: Mapping[str, torch.Tensor], params: Mapping) -> dict[str, torch.Tensor]:
    """Meta's single-file ``consolidated.pth`` state dict -> transformers Chameleon key layout.

    ``params``: ``params.json`` (its ``model`` section) with ``n_layers``, ``n_heads`` and
    optionally ``n_kv_heads``. Raises UsageError on a missing key (e.g. a sharded 30B file).
    """
    H = int(params["n_heads"])
    KV = int(params.get("n_kv_heads") or H)
    out = {
        "model.embed_tokens.weight": "tok_embeddings.weight",
        "model.norm.weight": "norm.weight",
        "lm_head.weight": "output.weight",
    }
    try:
        state = {k: loaded[v] for k, v in out.items()}
        for i in range(int(params["n_layers"])):
            a, m, src = f"model.layers.{i}.self_attn.", f"model.layers.{i}.", f"layers.{i}."
            state[a + "q_proj.weight"] = _permute_rotary(loaded[src + "attention.wq.weight"], H)
            state[a + "k_proj.weight"] = _permute_rotary(loaded[src + "attention.wk.weight"], KV)
            state[a + "v_proj.weight"] = loaded[src + "attention.wv.weight"]
            state[a + "o_proj.weight"] = loaded[src + "attention.wo.weight"]
            for ours, theirs, heads in (("q_norm", "q_normalization", H), ("k_norm", "k_normalization", KV)):
                for p in ("weight", "bias"):
                    state[f"{a}{ours}.{p}"] = _norm_rows(loaded[f"{src}attention.{theirs}.{p}"], heads)
            state[m + "mlp.gate_proj.weight"] = loaded[src + "feed_forward.w1.weight"]
            state[m + "mlp.down_proj.weight"] = loaded[src + "feed_forward.w2.weight"]
            state[m + "mlp.up_proj.weight"] = loaded[src + "feed_forward.w3.weight"]
            state[m + "input_layernorm.weight"] = loaded[src + "attention_norm.weight"]
            state[m + "post_attention_layernorm.weight"] = loaded[src + "ffn_norm.weight"]
    except KeyError as exc:
        raise UsageError(
            f"consolidated.pth lacks {exc}; only single-file Meta checkpoints (7B) are supported"
        ) from None
    return state


def _meta_checkpoint(model_dir: Path, tok_dir: Path):
    """Config and converted state of Meta's layout (``models/7b`` + ``tokenizer``)."""
    from transformers import ChameleonConfig

    params = json.loads((model_dir / "params.json").read_text())
    if (model_dir / "consolidate_params.json").is_file():
        params = {**params, **json.loads((model_dir / "consolidate_params.json").read_text())}
    mp = int(params.get("model_parallel_size", 1))
    params = params.get("model", params)
    ckpt = next((model_dir / n for n in ("consolidated.pth", "consolidated.00.pth") if (model_dir / n).is_file()), None)
    if ckpt is None:
        raise WeightsNotFoundError(f"{model_dir} has params.json but no consolidated.pth; finish the download")
    tok_file = tok_dir / "text_tokenizer.json"
    if not tok_file.is_file():
        raise WeightsNotFoundError(f"{tok_file} is missing; Meta's layout needs tokenizer/text_tokenizer.json")
    vocab = dict(json.loads(tok_file.read_text())["model"]["vocab"])
    if "<reserved08707>" in vocab:  # transformers' convention: this reserved token is the <image> placeholder
        vocab["<image>"] = vocab.pop("<reserved08707>")
    loaded = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)
    dim, mult = int(params["dim"]), int(params.get("multiple_of", 256))
    ffn = mult * ((int(float(params.get("ffn_dim_multiplier", 1)) * int(8 * dim / 3)) + mult - 1) // mult)
    theta = float(params.get("rope_theta", 10000.0))
    vq_kwargs = {}
    if (tok_dir / "vqgan.yaml").is_file():
        import yaml

        vc = vqgan_config_from_official(yaml.safe_load((tok_dir / "vqgan.yaml").read_text()))
        vq_kwargs = dict(
            embed_dim=vc.embed_dim,
            num_embeddings=vc.n_embed,
            latent_channels=vc.z_channels,
            resolution=vc.resolution,
            in_channels=vc.in_channels,
            base_channels=vc.ch,
            channel_multiplier=list(vc.ch_mult),
            num_res_blocks=vc.num_res_blocks,
            attn_resolutions=list(vc.attn_resolutions),
            double_latent=vc.double_z,
        )
    config = ChameleonConfig(
        vocab_size=int(loaded["tok_embeddings.weight"].shape[0]),
        hidden_size=dim,
        intermediate_size=ffn,
        num_hidden_layers=int(params["n_layers"]),
        num_attention_heads=int(params["n_heads"]),
        num_key_value_heads=int(params.get("n_kv_heads") or params["n_heads"]),
        rms_norm_eps=float(params["norm_eps"]),
        max_position_embeddings=16384 if theta > 10000.0 else 4096,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        model_parallel_size=mp,
        swin_norm=bool(params.get("swin_norm", False)),
        vq_config=vq_kwargs,
        vocabulary_map=vocab,
    )
    state = convert_meta_state(loaded, params)
    if (tok_dir / "vqgan.ckpt").is_file():
        vq = load_checkpoint_state(tok_dir / "vqgan.ckpt")
        state.update({f"model.vqmodel.{k}": v for k, v in vq.items() if not k.startswith("loss.")})
    return config, state


def checkpoint_layout(root: Path) -> Optional[tuple[str, Path]]:
    """``("hf", root)`` for a transformers directory, ``("meta", models/7b dir)`` for Meta's release, else None."""
    if (root / "config.json").is_file():
        return "hf", root
    for d in (root / "models" / "7b", root):
        if (d / "params.json").is_file():
            return "meta", d
    return None


def read_checkpoint(root: str | Path, device="cpu"):
    """(config, state dict in transformers keys, tokenizer file or None, folders to search for vqgan.ckpt)."""
    from transformers import ChameleonConfig

    root = Path(root).expanduser()
    layout = checkpoint_layout(root)
    if layout is None:
        raise WeightsNotFoundError(
            f"{root} is neither a transformers checkpoint (config.json) nor Meta's layout (models/7b/params.json)"
        )
    kind, d = layout
    if kind == "hf":
        tok = root / "tokenizer.json"
        config = ChameleonConfig.from_pretrained(str(root))
        if not config.vocabulary_map:  # transformers' classes need it; fall back to the tokenizer's vocabulary
            if not tok.is_file():
                raise UsageError(
                    f"{root}/config.json has no vocabulary_map and there is no tokenizer.json; "
                    "re-download the checkpoint"
                )
            from tokenizers import Tokenizer

            config.vocabulary_map = Tokenizer.from_file(str(tok)).get_vocab()
            config.image_token_id = config.vocabulary_map.get("<image>")
        return config, _hf_state(root, device), (tok if tok.is_file() else None), [root, root / "tokenizer"]
    tok_dir = root / "tokenizer" if (root / "tokenizer").is_dir() else d.parent.parent / "tokenizer"
    config, state = _meta_checkpoint(d, tok_dir)
    return config, state, tok_dir / "text_tokenizer.json", [tok_dir, root]


def build_lm(config, state: dict[str, torch.Tensor], device="cpu", dtype=torch.float32, what: str = "checkpoint"):
    """A ``ChameleonForConditionalGeneration`` holding ``state``, built on the meta device and
    filled by assignment, so no second copy of the weights is made (``state`` is consumed: its
    entries are converted in place). The VQ encoder (``model.vqmodel.*``) stays float32 and is
    optional. Lumina-mGPT's per-shard q/k norms (mp, head_dim) are expanded to per-head rows.

    Returns (lm, vq_state): vq_state holds every ``model.vqmodel.*`` tensor without the prefix
    (the VQGAN decoder of ``leloy/Anole-7b-v0.1-hf`` among them). Raises UsageError naming the
    first missing / unexpected / mis-shaped key.
    """
    from transformers import ChameleonForConditionalGeneration
    from transformers.models.chameleon.modeling_chameleon import ChameleonRotaryEmbedding

    with torch.device("meta"):
        lm = ChameleonForConditionalGeneration(config)
    own = {k: v.shape for k, v in lm.state_dict().items()}
    pre = "model.vqmodel."
    vq_state = {k[len(pre) :]: v for k, v in state.items() if k.startswith(pre)}
    for k in [k for k in state if k.startswith(pre) and k not in own]:
        del state[k]  # decoder weights: only in vq_state
    for k, v in state.items():
        if (
            (".q_norm." in k or ".k_norm." in k)
            and k in own
            and v.shape != own[k]
            and v.dim() == 2
            and v.shape[1] == own[k][1]
            and own[k][0] % v.shape[0] == 0
        ):
            state[k] = v.repeat_interleave(own[k][0] // v.shape[0], 0)  # Lumina-mGPT: one row per shard
    if "lm_head.weight" not in state and getattr(config, "tie_word_embeddings", False):
        state["lm_head.weight"] = state.get("model.embed_tokens.weight")
    vq_keys = [k for k in own if k.startswith(pre)]
    has_vq = any(k in state for k in vq_keys)
    missing = [k for k in own if k not in state and (has_vq or not k.startswith(pre))]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(state[k].shape)} != {tuple(own[k])}" for k in own if k in state and state[k].shape != own[k]]
    if missing or unexpected or shapes:
        parts = (
            ([f"missing {len(missing)} keys (e.g. {missing[0]})"] if missing else [])
            + ([f"unexpected {len(unexpected)} keys (e.g. {unexpected[0]})"] if unexpected else [])
            + ([f"shape mismatch ({shapes[0]})"] if shapes else [])
        )
        raise UsageError(f"{what} does not match the Chameleon architecture: {'; '.join(parts)}")
    for k in list(state):
        state[k] = state[k].to(device=device, dtype=torch.float32 if k.startswith(pre) else dtype)
    lm.load_state_dict(state, strict=False, assign=True)
    if not has_vq:
        lm.model.vqmodel = None
    lm.model.rotary_emb = ChameleonRotaryEmbedding(config=lm.config).to(device)
    left = [n for n, t in list(lm.named_parameters()) + list(lm.named_buffers()) if t.is_meta]
    if left:
        raise UsageError(f"{what}: {left[0]} was not loaded; the checkpoint is incomplete")
    return lm.eval().requires_grad_(False), vq_state


def locate_checkpoint(repo: str, alt_repos: Sequence[str], weights, model: str) -> Path:
    """The checkpoint folder: ``weights``, else the cached snapshot of ``repo`` or an alternative."""
    if weights is not None:
        root = Path(weights).expanduser()
        if root.is_dir() and checkpoint_layout(root) is not None:
            return root
        raise WeightsNotFoundError(
            f"{model}: --weights {weights} is neither a transformers checkpoint folder "
            f"(config.json) nor Meta's layout (models/7b/params.json); {download_hint(repo)}"
        )
    for r in (repo, *alt_repos):
        try:
            from huggingface_hub import snapshot_download

            root = Path(snapshot_download(r, local_files_only=True))
        except Exception:
            continue
        if checkpoint_layout(root) is not None:
            return root
    also = f" (or {', '.join(alt_repos)})" if alt_repos else ""
    raise WeightsNotFoundError(f"{model}: {repo}{also} is not in the local Hugging Face cache; {download_hint(repo)}")
