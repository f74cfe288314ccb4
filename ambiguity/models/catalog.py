"""The built-in model names: one :class:`ModelSpec` each, pure data (no weights are read here).

:mod:`ambiguity.models.registry` registers :data:`BUILTIN` at import; add a model by appending a
spec here (or calling :func:`ambiguity.models.registry.register` from your own code).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional, Union

from ambiguity.models.base import TokenModel
from ambiguity.models.llamagen import LLAMAGEN_C2I_REPO, LLAMAGEN_T2I_REPO

__all__ = ["ModelSpec", "BUILTIN"]


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: ``loader`` is a callable or ``"module:function"``; ``options`` go to it.

    ``kind`` is the loaded model's :attr:`TokenModel.kind` (``"c2i"``, ``"t2i"`` or ``"text"``),
    known before loading so that kind-dependent defaults (the CFG scale) resolve without weights.
    ``trees`` is False for layouts with end-of-row tokens (Lumina-mGPT, Emu3), which draft trees
    do not model: commands refuse ``--tree`` for them before loading any weights.
    ``codes`` (the codebook size V of the official layout) and ``classes`` (the number of classes
    of a c2i model) are known without weights; ``codes_key`` is where the checkpoint's
    ``config.json`` says V (e.g. ``("vq_config", "codebook_size")``), read before its weights
    (:func:`ambiguity.models.registry.spec_sizes`), so that out-of-range options are refused first.
    """

    name: str
    summary: str
    loader: Union[str, Callable[..., TokenModel]]
    options: dict = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    kind: str = "t2i"
    trees: bool = True
    codes: Optional[int] = None
    classes: Optional[int] = None
    codes_key: tuple[str, ...] = ()

    @property
    def compiles(self) -> Optional[bool]:
        """Whether the loaded adapter's forwards can run through ``torch.compile`` (``--compile``),
        from its loader alone: True for the LlamaGen-architecture loaders (:data:`COMPILING_LOADERS`),
        False for the transformers adapters (:data:`EAGER_LOADERS`), None when unknown (a loader
        registered by other code; the loaded model then answers)."""
        if self.loader in COMPILING_LOADERS:
            return True
        if self.loader in EAGER_LOADERS:
            return False
        return None

    def resolve_loader(self) -> Callable[..., TokenModel]:
        if callable(self.loader):
            return self.loader
        module, func = self.loader.split(":")
        return getattr(importlib.import_module(module), func)


# loaders whose models have compilable cached forwards (a static KV cache, written in place) and
# loaders of transformers adapters, which run eager only (ambiguity.models.base.TokenModel.compile_forwards)
COMPILING_LOADERS = frozenset(
    {
        "ambiguity.models.embedded:load_embedded",
        "ambiguity.models.llamagen:load_llamagen",
        "ambiguity.models.text_twin:load_text_twin",
    }
)
EAGER_LOADERS = frozenset(
    {
        "ambiguity.models.chameleon:load_chameleon",
        "ambiguity.models.janus:load_janus",
        "ambiguity.models.emu3:load_emu3",
        "ambiguity.models.hf_text:load_hf_causal_lm",
    }
)

BUILTIN: list[ModelSpec] = []


def _add(spec: ModelSpec) -> None:
    BUILTIN.append(spec)


_add(
    ModelSpec(
        "embedded",
        "LlamaGen-architecture c2i model trained on Fashion-MNIST, shipped with the package",
        "ambiguity.models.embedded:load_embedded",
        aliases=("fashion-mnist", "embedded-fashion-mnist"),
        kind="c2i",
        codes=1024,
        classes=10,
    )
)
_add(
    ModelSpec(
        "embedded-16",
        "The embedded model with LlamaGen's token geometry: 16384 x 8 l2-normalised codebook, "
        "16x16 tokens (Fashion-MNIST upsampled to 64 px), shipped with the package",
        "ambiguity.models.embedded:load_embedded",
        dict(variant="embedded-16"),
        aliases=("embedded16",),
        kind="c2i",
        codes=16384,
        classes=10,
    )
)

# Official LlamaGen class-conditional checkpoints (ImageNet, VQ-16 tokenizer).
_C2I = {
    "llamagen-c2i-b": ("GPT-B", 256, "c2i_B_256.pt"),
    "llamagen-c2i-b-384": ("GPT-B", 384, "c2i_B_384.pt"),
    "llamagen-c2i-l": ("GPT-L", 256, "c2i_L_256.pt"),
    "llamagen-c2i-l-384": ("GPT-L", 384, "c2i_L_384.pt"),
    "llamagen-c2i-xl-384": ("GPT-XL", 384, "c2i_XL_384.pt"),
    "llamagen-c2i-xxl-384": ("GPT-XXL", 384, "c2i_XXL_384.pt"),
    "llamagen-c2i-3b-384": ("GPT-3B", 384, "c2i_3B_384.pt"),
}
for _name, (_preset, _res, _file) in _C2I.items():
    _add(
        ModelSpec(
            _name,
            f"LlamaGen {_preset} class-conditional, {_res} px ({_res // 16}x{_res // 16} tokens)",
            "ambiguity.models.llamagen:load_llamagen",
            dict(
                preset=_preset,
                model_type="c2i",
                resolution=_res,
                gpt_file=_file,
                vq_file="vq_ds16_c2i.pt",
                repo=LLAMAGEN_C2I_REPO,
                name=_name,
            ),
            aliases=(_name.replace("-384", ""),)
            if _name.endswith("-384") and _name.replace("-384", "") not in _C2I
            else (),
            kind="c2i",
            codes=16384,
            classes=1000,
        )
    )

# Official LlamaGen text-conditional checkpoints (flan-t5-xl captions, VQ-16 t2i tokenizer).
for _stage, _res in ((1, 256), (2, 512)):
    _name = f"llamagen-t2i-stage{_stage}"
    _add(
        ModelSpec(
            _name,
            f"LlamaGen GPT-XL text-to-image Stage {'I' * _stage}, {_res} px ({_res // 16}x{_res // 16} tokens)",
            "ambiguity.models.llamagen:load_llamagen",
            dict(
                preset="GPT-XL",
                model_type="t2i",
                resolution=_res,
                gpt_file=f"t2i_XL_stage{_stage}_{_res}.pt",
                vq_file="vq_ds16_t2i.pt",
                repo=LLAMAGEN_T2I_REPO,
                stage=_stage,
                name=_name,
            ),
            codes=16384,
        )
    )

_CHAMELEON_SIZES = dict(codes=8192, codes_key=("vq_config", "num_embeddings"))
_JANUS_SIZES = dict(codes=16384, codes_key=("vq_config", "num_embeddings"))

# Models behind transformers classes (adapters in their own modules; weights from --weights or the HF cache).
_add(
    ModelSpec(
        "anole",
        "Anole-7b (Chameleon architecture, image generation), 512 px (32x32 tokens); "
        "leloy/Anole-7b-v0.1-hf or GAIR/Anole-7b-v0.1 layout",
        "ambiguity.models.chameleon:load_chameleon",
        dict(
            repo="leloy/Anole-7b-v0.1-hf",
            alt_repos=("GAIR/Anole-7b-v0.1",),
            style="chameleon",
            resolution=512,
            name="anole",
        ),
        aliases=("anole-7b",),
        **_CHAMELEON_SIZES,
    )
)
_add(
    ModelSpec(
        "chameleon-7b",
        "Chameleon-7b (facebook/chameleon-7b), 512 px (32x32 tokens)",
        "ambiguity.models.chameleon:load_chameleon",
        dict(repo="facebook/chameleon-7b", style="chameleon", resolution=512, name="chameleon-7b"),
        **_CHAMELEON_SIZES,
    )
)
_add(
    ModelSpec(
        "lumina-mgpt",
        "Lumina-mGPT 7B 768 px (Chameleon architecture, 48x48 tokens + end-of-row tokens)",
        "ambiguity.models.chameleon:load_chameleon",
        dict(repo="Alpha-VLLM/Lumina-mGPT-7B-768", style="lumina", resolution=768, name="lumina-mgpt"),
        trees=False,
        **_CHAMELEON_SIZES,
    )
)
_add(
    ModelSpec(
        "janus-pro-1b",
        "Janus-Pro-1B text-to-image, 384 px (24x24 tokens), transformers layout deepseek-community/Janus-Pro-1B",
        "ambiguity.models.janus:load_janus",
        dict(repo="deepseek-community/Janus-Pro-1B", name="janus-pro-1b"),
        aliases=("janus-pro",),
        **_JANUS_SIZES,
    )
)
_add(
    ModelSpec(
        "janus-pro-7b",
        "Janus-Pro-7B text-to-image, 384 px (24x24 tokens), transformers layout deepseek-community/Janus-Pro-7B",
        "ambiguity.models.janus:load_janus",
        dict(repo="deepseek-community/Janus-Pro-7B", name="janus-pro-7b"),
        **_JANUS_SIZES,
    )
)
_add(
    ModelSpec(
        "emu3-gen",
        "Emu3-Gen text-to-image, 720 px (90x90 tokens, end-of-row tokens hidden), transformers layout BAAI/Emu3-Gen-hf",
        "ambiguity.models.emu3:load_emu3",
        dict(repo="BAAI/Emu3-Gen-hf", name="emu3-gen"),
        aliases=("emu3",),
        trees=False,
        codes=32768,
        codes_key=("vq_config", "codebook_size"),
    )
)
_add(
    ModelSpec(
        "text-twin",
        "Embedded text twin: the embedded model's architecture trained on KJV English prose",
        "ambiguity.models.text_twin:load_text_twin",
        aliases=("embedded-text",),
        kind="text",
        codes=1024,
    )
)
