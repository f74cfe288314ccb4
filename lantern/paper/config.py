"""Settings of a paper run: which models, how many images per measurement, the paper's k and δ.

The paper's neighbourhood sizes (k = 100, 300, 1000) and its top-k filter (2000) refer to
LlamaGen's 16384-code VQ codebook. On a model with another codebook they are mapped by the same
fraction of the codebook (:func:`map_to_codebook`), and the report says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from ambiguity.errors import UsageError
from lantern.paper.published import PAPER_CODEBOOK, SETTINGS

__all__ = ["PaperConfig", "QUICK", "map_to_codebook"]


def map_to_codebook(k: int, vocab_size: int, paper_vocab: int = PAPER_CODEBOOK) -> int:
    """The paper's ``k`` of a ``paper_vocab`` codebook as the same fraction of ``vocab_size``,
    at least 1 and at most ``vocab_size - 1`` (unchanged when the sizes agree)."""
    if vocab_size == paper_vocab:
        return int(k)
    return int(min(vocab_size - 1, max(1, round(k * vocab_size / paper_vocab))))


@dataclass(frozen=True)
class PaperConfig:
    """What ``python -m lantern.paper`` measures (every field is recorded in the report).

    models: registry names; image models first in the report, the first image model is the
    *primary* one that the decoding experiments (Fig. 3-5, Tables 2-3, App. F) run on.
    weights / drafters: {model: path} (default: shipped files, the local Hugging Face cache).
    main_images: images per method at temperature 1 for Table 2 and App. F.1 (each image once,
    interleaved across AR, EAGLE-2 and LANTERN: a timing round); greedy_images: the same at
    temperature 0; grid_images: images per (k, δ) cell of Fig. 4/5, Table 3 and the
    precision/recall grid (the first ``grid_images`` rounds of the temperature-1 session);
    fig2a_images: images per model and temperature for Fig. 2a; random_init_images: images per
    temperature with a random-initialised drafter (Fig. 2b); profile_images: images per model
    for Fig. 2c; interchange_images: images for Fig. 3; pairs_images: AR images whose (p, q)
    pairs measure the distortion; show: images per cell in the Fig. 4 grid. batch_size: images
    per forward for a session's untimed rounds (:mod:`lantern.engine.loop`: every method; default 32,
    1 in quick mode); with batch_size > 1 only the first ``timing_images`` rounds are timed (batch 1,
    interleaved) and the speed-ups come from them; with 1 every round is timed (the samples are
    the timed decodes). compile: run the LlamaGen-architecture models' and their drafters' cached
    forwards through ``torch.compile`` (``--compile``, :func:`lantern.engine.decode.compile_forwards`;
    the timing warm-up absorbs the compilation; not bit-exact, see the README).
    ks, deltas: the paper's grid (k on the paper's codebook; mapped); paper_k, paper_delta: its
    main LANTERN setting; f2_delta: App. F.2's δ; jsd_deltas: JSD bounds (nats) for Table 3;
    guidance, top_k (paper's codebook; mapped), top_p: sampling of image models (text models:
    no guidance, no filters); tree: EAGLE-2 dynamic tree (total tokens incl. the root, depth,
    top-k per node); extractors: quality feature extractors; reference: the real-image set (a
    seeded 2000-image subset of the Fashion-MNIST test split by default: MobileNet features cost
    about 0.3 s per image on a CPU).
    """

    models: tuple[str, ...] = ("embedded", "text-twin")
    weights: dict = field(default_factory=dict)
    drafters: dict = field(default_factory=dict)
    device: str = "auto"
    dtype: Optional[str] = None
    quick: bool = False
    seed: int = 0
    main_images: int = 300
    greedy_images: int = 100
    grid_images: int = 100
    fig2a_images: int = 32
    random_init_images: int = 16
    profile_images: int = 256
    interchange_images: int = 64
    pairs_images: int = 32
    show: int = 3
    batch_size: int = 32
    timing_images: int = 50
    compile: bool = False
    ks: tuple[int, ...] = (100, 300, 1000)
    deltas: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4)
    paper_k: int = SETTINGS["k"]
    paper_delta: float = SETTINGS["delta"]
    f2_delta: float = 0.4
    jsd_deltas: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3)
    guidance: float = SETTINGS["guidance"]
    top_k: int = SETTINGS["top_k"]
    top_p: float = SETTINGS["top_p"]
    tree: tuple[int, int, int] = (59, 4, 10)
    extractors: tuple[str, ...] = ("fmnist", "mobilenet")
    reference: str = "fashion-mnist:test@2000"
    captions: Optional[str] = None
    data: Optional[str] = None

    def __post_init__(self):
        sizes = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name.endswith("_images")}
        bad = [k for k, v in sizes.items() if int(v) < 1]
        if bad:
            raise UsageError(f"--{bad[0].replace('_', '-')} must be >= 1, got {sizes[bad[0]]}")
        if self.grid_images > self.main_images:
            raise UsageError(
                f"--grid-images ({self.grid_images}) cannot exceed --main-images ({self.main_images}): "
                f"the grid cells are the first images of the main session"
            )
        if int(self.batch_size) < 1:
            raise UsageError(f"--batch-size must be >= 1, got {self.batch_size}")
        if not self.models:
            raise UsageError("--models needs at least one model")

    def settings(self) -> dict:
        """The record stored with the run (and compared on resume); the batching fields only when
        batch_size > 1 and ``compile`` only when set (otherwise they change nothing, so runs recorded
        before them still resume)."""
        out = dataclasses.asdict(self)
        if not self.compile:
            out.pop("compile")
        if self.batch_size == 1:
            out.pop("batch_size")
            out.pop("timing_images")
        return out


QUICK = dict(
    quick=True,
    batch_size=1,  # a few images: each one timed
    main_images=6,
    greedy_images=4,
    grid_images=4,
    fig2a_images=3,
    random_init_images=2,
    profile_images=16,
    interchange_images=8,
    pairs_images=4,
    show=2,
    ks=(300, 1000),
    deltas=(0.1, 0.4),
    jsd_deltas=(0.03, 0.3),
    extractors=("fmnist",),
)
