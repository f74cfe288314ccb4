"""The state a paper run shares between experiments: its directory, models, drafters, shard."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from ambiguity.distributed import SINGLE, Shard
from ambiguity.errors import UsageError
from ambiguity.models.base import TokenModel, resolve_device
from ambiguity.models.registry import get_spec, load_model, resolve_dtype
from ambiguity.runs import RunDir
from lantern.drafter.model import Drafter, drafter_digest, load_drafter
from lantern.engine.decode import compile_forwards
from lantern.paper.config import PaperConfig, map_to_codebook

__all__ = ["Context"]


@dataclass
class Context:
    """One paper run: ``config``, the run directory ``run`` (``runs/paper/<name>``), this process's
    ``shard`` and lazily loaded models and drafters (one copy each per process); ``expected_digests``:
    a resumed run's recorded weights digests, which every model and trained drafter is checked
    against as it loads (UsageError when they differ)."""

    config: PaperConfig
    run: RunDir
    shard: Shard = SINGLE
    progress: bool = True
    sessions: dict = field(default_factory=dict)  # the primary model's decoding sessions by temperature
    expected_digests: Optional[dict] = None  # a resumed run's recorded weights digests, checked as models load
    _models: dict = field(default_factory=dict)
    _drafters: dict = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.run.path

    @property
    def device(self) -> torch.device:
        return self.shard.device(resolve_device(self.config.device))

    @property
    def bars(self) -> Optional[bool]:
        """The ``progress`` argument of library calls whose bars show by their own rule when allowed
        (e.g. the k-NN builder's from 8192 codes): None under ``progress``, False with ``--no-progress``."""
        return None if self.progress else False

    # ------------------------------------------------------------------ models
    def kind(self, name: str) -> str:
        """The registry's kind of ``name`` ("c2i", "t2i", "text") without loading it."""
        return get_spec(name).kind

    @property
    def image_models(self) -> list[str]:
        return [m for m in self.config.models if self.kind(m) != "text"]

    @property
    def primary(self) -> str:
        """The image model the decoding experiments run on (the first in ``--models``)."""
        if not self.image_models:
            raise UsageError(
                "--models names no image model; the decoding experiments need one, e.g. --models embedded,text-twin"
            )
        return self.image_models[0]

    def model(self, name: str) -> TokenModel:
        if name not in self._models:
            self._models[name] = load_model(
                name,
                weights=self.config.weights.get(name),
                device=self.device,
                dtype=resolve_dtype(self.config.dtype, self.device),
            )
            self._check_digest(name, lambda: self._models[name].weights_digest())
            if self.config.compile:
                compile_forwards(self._models[name])
        return self._models[name]

    def _check_digest(self, key: str, digest) -> None:
        """Raise UsageError when a resumed run recorded another weights digest for ``key`` (a model
        name or ``"<primary> drafter"``) than ``digest()`` gives now: retrained weights must not
        continue the run."""
        if self.expected_digests is None or key not in self.expected_digests:
            return
        now = digest()
        if now != self.expected_digests[key]:
            raise UsageError(
                f"the weights of {key} changed since {self.path} was started ({self.expected_digests[key]} there, "
                f"{now} now); pass --overwrite to start over, or another --out"
            )

    def drafter(self, name: str, which: str = "trained"):
        """The model's trained drafter (``--drafter MODEL=FILE`` or the shipped one) or, with
        ``which="random-init"``, a randomly initialised drafter of the same architecture (seeded)."""
        key = (name, which)
        if key not in self._drafters:
            model = self.model(name)
            if which == "random-init":
                self._drafters[key] = Drafter.for_target(model, dtype=model.dtype, seed=self.config.seed).eval()
            else:
                self._drafters[key] = load_drafter(model, self.config.drafters.get(name))
                self._check_digest(f"{name} drafter", lambda: drafter_digest(self._drafters[key]))
            if self.config.compile:
                compile_forwards(model, self._drafters[key])
        return self._drafters[key]

    def weights_digests(self) -> dict:
        """``{model: its weights digest}`` for every model, and ``{"<primary> drafter": digest}`` of the
        primary model's trained drafter (None where none loads): what the run record adds to the
        configuration, so that weights retrained in place refuse a run instead of resuming it into a
        mix (:meth:`~ambiguity.models.base.TokenModel.weights_digest`,
        :func:`~lantern.drafter.model.drafter_digest`)."""
        out = {m: self.model(m).weights_digest() for m in self.config.models}
        try:
            out[f"{self.primary} drafter"] = drafter_digest(self.drafter(self.primary))
        except UsageError:  # no drafter for it: the experiments that need one were refused by the preflight
            out[f"{self.primary} drafter"] = None
        return out

    def k(self, name: str, paper_k: int) -> int:
        """The paper's k mapped to ``name``'s codebook (:func:`map_to_codebook`)."""
        return map_to_codebook(paper_k, self.model(name).vocab_size)

    def subdir(self, *parts: str) -> Path:
        p = self.path.joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def note_quick(self) -> Optional[str]:
        return (
            (
                "QUICK MODE: a handful of images per measurement; numbers show that the pipeline runs, not what the "
                "model does"
            )
            if self.config.quick
            else None
        )
