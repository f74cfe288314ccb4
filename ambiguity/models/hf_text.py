"""Any Hugging Face causal LM behind the toolkit's protocol (``--model hf:<repo id or path>``).

The text counterpart of the visual models: the same ambiguity statistics over a text LM's
next-token distributions (kind ``"text"``). The "image tokens" are the whole vocabulary
(``image_token_ids = arange(V)``, the ``lm_head`` rows), the grid is ``(1, length)`` with
``length`` the number of tokens profiled per prompt, and there is no codebook and no pixels.

Prompts are strings (e.g. one per line of a text file, :func:`read_prompts`), tokenised with the
model's tokenizer and its special tokens (BOS where the tokenizer adds one; a prompt that
tokenises to nothing starts from BOS, else EOS). Text LMs have no unconditional branch, so
classifier-free guidance is refused.

Hidden states are the base model's ``last_hidden_state`` (after the final norm); logits are the
``lm_head`` of those (with the final logit soft-capping of models that have one, e.g. Gemma 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch

from ambiguity.errors import UsageError
from ambiguity.models.base import Prompt
from ambiguity.models.hf_common import HFTokenModel, left_pad_ids, load_pretrained, load_tokenizer, rows_of
from ambiguity.models.hf_draft_layer import make_draft_layer

__all__ = ["HFCausalLM", "load_hf_causal_lm", "read_prompts"]


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a UTF-8 text file, one per non-empty line (surrounding whitespace removed).

    Raises UsageError when the file is missing, unreadable or has no prompt.
    """
    path = Path(path).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"prompts file {path} does not exist; pass a text file with one prompt per line") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read prompts file {path} ({exc}); pass a UTF-8 text file") from None
    prompts = [line.strip() for line in lines if line.strip()]
    if not prompts:
        raise UsageError(f"prompts file {path} has no prompts; write one prompt per line")
    return prompts


class HFCausalLM(HFTokenModel):
    """A transformers ``*ForCausalLM`` as a text :class:`~ambiguity.models.base.TokenModel`.

    Args:
        model: the causal LM, eval mode.
        tokenizer: its tokenizer.
        name: registry name (``"hf:<repo>"``).
        length: tokens generated / profiled per prompt (the grid is ``(1, length)``).
    """

    kind = "text"

    def __init__(self, model, tokenizer, name: str = "hf", length: int = 64):
        if int(length) < 1:
            raise UsageError(f"length must be >= 1 tokens per prompt, got {length}")
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
        self.text_embeddings = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        config = model.config
        p = next(self.decoder.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.image_token_ids = torch.arange(self.lm_head.weight.shape[0], device=self.device)
        self.hidden_size = int(self.lm_head.weight.shape[1])
        self.grid = (1, int(length))
        self.max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.logit_scale = getattr(config, "logit_scale", None)
        specials = [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id, 0]
        self.pad_id = next(i for i in specials if i is not None)
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.start_id = start if start is not None else self.pad_id

    def make_prompt(self, conditions: Sequence[str], guided: bool = False) -> Prompt:
        """Prompts -> Prompt with ``inputs = {"ids": (B, P), "mask": (B, P)}`` (left-padded).

        Raises UsageError for CFG (text LMs have no unconditional branch) or bad prompts.
        """
        if guided:
            raise UsageError(f"{self.name} is a text LM without classifier-free guidance; use --cfg 1")
        prompts = rows_of(conditions, "prompts")
        seqs = []
        for text in prompts:
            ids = list(self.tokenizer(text)["input_ids"])
            seqs.append(ids or [self.start_id])
        self.check_prompt_ids(seqs, prompts)
        ids, mask = left_pad_ids(seqs, self.pad_id, self.device)
        return Prompt({"ids": ids, "mask": mask}, len(prompts), False, prompts)

    def embed_codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (rows, T) -> input embeddings (rows, T, H) in the model dtype."""
        return self.text_embeddings(tokens.to(self.device))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """``lm_head`` (+ the model's logit scaling / soft-capping): (..., H) -> float32 (..., V)."""
        logits = self.lm_head(hidden).float()
        if self.logit_scale:
            logits = logits * float(self.logit_scale)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def draft_layer(self):
        """A fresh decoder layer of the model's own class from its config (see :class:`HFDraftLayer`)."""
        return make_draft_layer(self.decoder, self.model.config, self.device, self.dtype)

    def input_embeddings(self) -> torch.Tensor:
        """The input embedding matrix, (V, H) float32."""
        return self.text_embeddings.weight.detach().float()

    def output_embeddings(self) -> torch.Tensor:
        """The ``lm_head`` matrix, (V, H) float32."""
        return self.lm_head.weight.detach().float()


def load_hf_causal_lm(
    weights=None, device="cpu", dtype=torch.float32, repo: str = "", length: int = 64, name: Optional[str] = None
) -> HFCausalLM:
    """Load ``AutoModelForCausalLM`` + tokenizer from ``weights``, the directory ``repo`` or the
    local HF cache of the repo id ``repo``, offline.

    Raises UsageError for an empty repo and WeightsNotFoundError (naming the repo) when absent.
    """
    from transformers import AutoModelForCausalLM

    if not repo:
        raise UsageError("name the model as hf:<repo id or local directory>, e.g. hf:gpt2")
    label = name or f"hf:{repo}"
    model = load_pretrained(AutoModelForCausalLM, repo, weights, device, dtype, label)
    return HFCausalLM(model, load_tokenizer(repo, weights, label), name=label, length=length)
