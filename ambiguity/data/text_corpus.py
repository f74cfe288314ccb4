"""Public-domain English prose for the embedded text twin: corpus, byte-level BPE, 64-token passages.

The default corpus is the King James Version of the Bible (public domain), as printed by
Debian's ``bible`` program (``apt-get install bible-kjv``; its data file
``/usr/lib/bible.data`` is compressed and only that program reads it). Any UTF-8 text file
works instead (``--corpus FILE``: paragraphs separated by blank lines are the chapters, their
non-empty lines the verses).

The unit of the corpus is a *verse* (for other files: a non-empty line). A training sample is
a *passage*: the ``length`` tokens that start at the first token of a verse and run on across
the following verses, so that generation from the beginning-of-sequence prefix starts a verse,
just as an image starts at its top-left token. Held-out passages come from held-out chapters
(every ``test_every``-th chapter), never from the chapters the model or the tokenizer saw.

The tokenizer is a byte-level BPE (``tokenizers`` library) with exactly ``vocab_size`` entries
and no special tokens: the beginning of a sequence is the GPT's single class token, not a
vocabulary entry, so the twin's vocabulary matches the image model's codebook size one to one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ambiguity.errors import UsageError

__all__ = [
    "Chapter",
    "KJV_RANGE",
    "read_kjv",
    "parse_bible_output",
    "read_text_file",
    "load_corpus",
    "split_chapters",
    "train_tokenizer",
    "load_tokenizer",
    "encode_chapters",
    "passages",
    "disjoint_starts",
    "synthetic_corpus",
]

KJV_RANGE = "gen1:1-rev22:21"
_VERSE = re.compile(r"^\s+(\d+)\s+(.*\S)\s*$")


@dataclass
class Chapter:
    """One document of the corpus: ``name`` (e.g. ``"Genesis 1"``) and its verses (str, in order)."""

    name: str
    verses: list[str]


def read_kjv(program: str = "bible") -> list[Chapter]:
    """The whole KJV (1,189 chapters, 31,102 verses) from Debian's ``bible`` program.

    Runs ``bible -l0 gen1:1-rev22:21`` (one verse per line, no wrapping). Raises UsageError
    naming the package to install when the program is absent or prints nothing usable.
    """
    exe = shutil.which(program)
    if exe is None:
        raise UsageError(
            f"the `{program}` program is not installed; run `apt-get install bible-kjv` "
            f"or pass --corpus FILE with English prose"
        )
    try:
        out = subprocess.run([exe, "-l0", KJV_RANGE], capture_output=True, text=True, check=True, timeout=120).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        raise UsageError(
            f"`{program} -l0 {KJV_RANGE}` failed ({exc}); reinstall bible-kjv-text or pass --corpus FILE"
        ) from None
    chapters = parse_bible_output(out)
    if not chapters:
        raise UsageError(f"`{program}` printed no verses; reinstall bible-kjv-text or pass --corpus FILE")
    return chapters


def parse_bible_output(text: str) -> list[Chapter]:
    """Parse ``bible -l0`` output: heading lines ("1 Samuel 3"), then indented "  N verse" lines."""
    chapters: list[Chapter] = []
    for line in text.splitlines():
        m = _VERSE.match(line)
        if m:
            if not chapters:
                chapters.append(Chapter("untitled", []))
            chapters[-1].verses.append(m.group(2))
        elif line.strip():
            chapters.append(Chapter(line.strip(), []))
    return [c for c in chapters if c.verses]


def read_text_file(path: str | Path) -> list[Chapter]:
    """A UTF-8 text file -> chapters: blank-line separated paragraphs, their non-empty lines as verses.

    Raises UsageError when the file is missing, unreadable or has no text.
    """
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"corpus file {path} does not exist; check --corpus") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read corpus file {path} ({exc}); pass a UTF-8 text file") from None
    chapters = []
    for i, para in enumerate(re.split(r"\n\s*\n", text)):
        lines = [ln.strip() for ln in para.splitlines() if ln.strip()]
        if lines:
            chapters.append(Chapter(f"{path.name}:{i}", lines))
    if not chapters:
        raise UsageError(f"corpus file {path} has no text; pass a file with English prose")
    return chapters


def load_corpus(corpus: Optional[str | Path] = None) -> list[Chapter]:
    """``None`` or ``"kjv"`` -> :func:`read_kjv`; anything else -> :func:`read_text_file`."""
    if corpus is None or str(corpus) == "kjv":
        return read_kjv()
    return read_text_file(corpus)


def split_chapters(chapters: Sequence[Chapter], test_every: int = 10) -> tuple[list[Chapter], list[Chapter]]:
    """Deterministic held-out split: chapter i goes to test when ``i % test_every == test_every - 1``.

    Returns (train, test). Raises UsageError when either side would be empty.
    """
    if test_every < 2:
        raise UsageError(f"--test-every (hold out every N-th chapter) must be >= 2, got {test_every}")
    train = [c for i, c in enumerate(chapters) if i % test_every != test_every - 1]
    test = [c for i, c in enumerate(chapters) if i % test_every == test_every - 1]
    if not train or not test:
        raise UsageError(
            f"the corpus has {len(chapters)} chapters, too few for a held-out split every "
            f"{test_every}; pass a larger --corpus"
        )
    return train, test


def _verse_texts(chapters: Sequence[Chapter]) -> list[str]:
    # A leading space on every verse: byte-level BPE then sees " word" units everywhere, and a
    # passage that starts at a verse looks like one that runs on from the previous verse.
    return [" " + v for c in chapters for v in c.verses]


def train_tokenizer(chapters: Sequence[Chapter], vocab_size: int):
    """Train a byte-level BPE with exactly ``vocab_size`` tokens (256 bytes + merges, no specials).

    Returns a ``tokenizers.Tokenizer``. Deterministic for a given corpus. Raises UsageError
    when ``vocab_size`` < 257 or the corpus is too small to learn that many merges.
    Source: Sennrich et al. (2016) BPE; byte-level alphabet as in GPT-2 (Radford et al., 2019).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size <= 256:
        raise UsageError(f"a byte-level BPE needs vocab_size > 256, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_verse_texts(chapters), trainer)
    if tok.get_vocab_size() != vocab_size:
        raise UsageError(
            f"the corpus only supports {tok.get_vocab_size()} BPE tokens, not {vocab_size}; pass a larger --corpus"
        )
    return tok


def load_tokenizer(path: str | Path):
    """Read a tokenizer JSON written by ``Tokenizer.save``; UsageError when absent or unreadable."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"tokenizer file {path} not found; run `python scripts/train_text_twin.py`")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise UsageError(f"cannot read tokenizer {path} ({exc}); retrain it with scripts/train_text_twin.py") from None


def encode_chapters(tokenizer, chapters: Sequence[Chapter]) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenise a list of chapters into one stream.

    Returns ``(ids, starts)``: ids (N,) int64 token ids of all verses in order; starts (M,)
    int64 index in ``ids`` of the first token of each of the M verses.
    """
    enc = tokenizer.encode_batch(_verse_texts(chapters))
    lengths = torch.tensor([len(e.ids) for e in enc], dtype=torch.long)
    ids = torch.tensor([i for e in enc for i in e.ids], dtype=torch.long)
    starts = torch.cumsum(lengths, 0) - lengths
    return ids, starts


def passages(ids: torch.Tensor, starts: torch.Tensor, length: int = 64, stride: int = 1) -> torch.Tensor:
    """Passages of ``length`` tokens starting at every ``stride``-th verse start.

    ids (N,) int64, starts (M,) int64 -> (P, length) int64; verses whose passage would run
    past the end of the stream are dropped. ``stride = 1`` gives overlapping training passages;
    pick a larger stride (or :func:`disjoint_starts`) for held-out passages that do not overlap.
    """
    keep = starts[::stride]
    keep = keep[keep + length <= ids.numel()]
    if keep.numel() == 0:
        return torch.empty(0, length, dtype=torch.long)
    return ids[keep[:, None] + torch.arange(length)[None]]


def disjoint_starts(starts: torch.Tensor, length: int) -> torch.Tensor:
    """Greedy subset of verse starts whose ``length``-token passages do not overlap: (M,) -> (M',)."""
    out, nxt = [], -1
    for s in starts.tolist():
        if s >= nxt:
            out.append(s)
            nxt = s + length
    return torch.tensor(out, dtype=torch.long)


def synthetic_corpus(n_chapters: int = 40, verses_per_chapter: int = 6, seed: int = 0) -> list[Chapter]:
    """A tiny deterministic English-like corpus for tests and ``--quick`` runs (no package needed)."""
    import random

    rng = random.Random(seed)
    subjects = ["the king", "a shepherd", "the people", "my brother", "the prophet", "her mother", "the elders"]
    verbs = ["went up to", "spake unto", "looked upon", "came into", "gave bread to", "blessed", "remembered"]
    objects = ["the city", "the river", "the house of the lord", "the mountain", "the field", "his servants"]
    tails = ["and it was evening.", "in those days.", "for ever.", "with a loud voice.", "before the morning."]
    chapters = []
    for c in range(n_chapters):
        verses = []
        for _ in range(verses_per_chapter):
            s = f"{rng.choice(subjects).capitalize()} {rng.choice(verbs)} {rng.choice(objects)} {rng.choice(tails)}"
            verses.append(s)
        chapters.append(Chapter(f"Synthetic {c + 1}", verses))
    return chapters
