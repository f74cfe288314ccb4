"""Decoding sessions: one pass that gives a method's speed, its statistics and its samples.

A *session* decodes images ``0 .. rounds-1`` of one model at one temperature with several
methods, interleaved: round ``r`` decodes image ``r`` with every method in a fresh random order
after a warm-up (:func:`lantern.timing.interleaved_timing`). Image ``r`` draws from its own
random stream (:mod:`ambiguity.seeding`), so a method's decode of image ``r`` is the same
whether it is timed or not: the timed decodes *are* the method's samples. Every round is a
checked part of ``sessions/<name>/`` (timing rows, step records with per-step reached and
committed draft counts, image rows, tokens), so an interrupted session resumes at the next
round, and under torchrun the rounds are split across ranks (``r % world == rank``).

With ``--batch-size B > 1`` only the first ``--timing-images`` rounds are timed that way; the
other rounds are decoded per method in batches of B images (:mod:`lantern.engine.loop`, draft trees
included) and stored as the same round parts without timing rows: statistics, samples and quality
use every round, speed-ups the timed ones. Untimed rounds go in chunks of 16 batches, method by
method; each method's decode of a chunk is kept as a ``pending_*`` part until the chunk's round
parts are written, so an interrupted session loses at most the method it was decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd
import torch

from ambiguity.conditions import generation_conditions
from ambiguity.runs import RunDir, assemble_units, shard_units
from ambiguity.sampling import SamplingConfig
from lantern.drafter.model import drafter_digest
from lantern.engine.decode import DecodeConfig, decode
from lantern.engine.records import Decoded
from lantern.evaluate import score_images
from lantern.paper.context import Context
from lantern.timing import TIMING_COLUMNS, interleaved_timing, neighbour_tables, speedup_table

__all__ = [
    "Method",
    "Session",
    "SessionData",
    "sampling_for",
    "run_session",
    "pixels",
    "quality",
]

COMMAND = "python -m lantern.paper (session)"


@dataclass(frozen=True)
class Method:
    """One decoding method of a session: a name (``"ar"``, ``"eagle2"``, ``"lantern-k62-d0.1"``),
    its :class:`~lantern.engine.decode.DecodeConfig`, the drafter it uses (``"trained"`` or
    ``"random-init"``), how many leading rounds it takes part in (None: all) and its label."""

    name: str
    config: DecodeConfig
    label: str
    drafter: str = "trained"
    rounds: Optional[int] = None
    facts: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Session:
    """``rounds`` images of ``model`` at ``temperature`` decoded by every method (module docstring)."""

    name: str
    model: str
    temperature: float
    methods: tuple[Method, ...]
    rounds: int


def sampling_for(ctx: Context, model: str, temperature: float) -> SamplingConfig:
    """The paper's sampling for image models (guidance, top-k mapped to the codebook, top-p);
    text models sample without guidance or filters."""
    if ctx.kind(model) == "text":
        return SamplingConfig(guidance=1.0, temperature=temperature)
    c = ctx.config
    return SamplingConfig(guidance=c.guidance, temperature=temperature, top_k=ctx.k(model, c.top_k), top_p=c.top_p)


@dataclass
class SessionData:
    """A finished session: ``timing`` (:data:`lantern.timing.TIMING_COLUMNS`, one row per method
    and round), ``steps`` and ``images`` (decode records with a ``method`` column), ``tokens``
    {method: (n, N) int64}, the ``session``, its run directory and its ``sampling``."""

    session: Session
    run: RunDir
    sampling: SamplingConfig
    conditions: list
    timing: pd.DataFrame
    steps: pd.DataFrame
    images: pd.DataFrame
    tokens: dict

    def stats(self, method: str, n: Optional[int] = None) -> dict:
        """τ (mean accepted length, bonus counted), tokens per target forward, acceptance rate
        (committed / reached drafts) and images, over the first ``n`` images of ``method``."""
        st = self.steps[self.steps["method"] == method]
        im = self.images[self.images["method"] == method]
        if n is not None:
            st, im = st[st["image"] < n], im[im["image"] < n]
        reached = float(st["reached"].sum())
        return {
            "images": int(len(im)),
            "tau": float((st["accepted"] + 1).mean()) if len(st) else float("nan"),
            "tokens_per_forward": float(im["tokens"].sum() / im["target_forwards"].sum()),
            "acceptance_rate": float(st["committed"].sum()) / reached if reached else float("nan"),
        }

    def speed(self, n: Optional[int] = None, methods: Optional[Sequence[str]] = None) -> pd.DataFrame:
        """:func:`lantern.timing.speedup_table` over the first ``n`` rounds (and ``methods``), against AR."""
        t = self.timing if n is None else self.timing[self.timing["round"] < n]
        if methods is not None:
            t = t[t["config"].isin(list(methods) + ["ar"])]
        return speedup_table(t, baseline="ar")


def _round_units(session: Session) -> list[tuple[str, dict]]:
    """Name and content of every round's part: one unit per round (the methods that take part)."""
    return [
        (
            f"round_{r:05d}",
            {"round": r, "methods": sorted(m.name for m in session.methods if m.rounds is None or r < m.rounds)},
        )
        for r in range(session.rounds)
    ]


def _step_counts(d: Decoded) -> pd.DataFrame:
    """The decode's step rows with the reached and committed draft tokens of each step."""
    steps, drafts, _ = d.frames()
    if len(drafts):
        per = drafts.groupby(["image", "step"])[["reached", "committed"]].sum().reset_index()
        steps = steps.merge(per, on=["image", "step"], how="left")
    else:
        steps = steps.assign(reached=0, committed=0)
    return steps.fillna({"reached": 0, "committed": 0})


def _session_run(ctx: Context, session: Session, model, sampling: SamplingConfig, drafters: dict) -> RunDir:
    """The session's run directory under ``sessions/<name>``, opened for any number of shards (its
    rounds are independent units), with the record: model, sampling, seed, each method's config and
    drafter digest, captions."""
    settings = {
        "model": model.describe(),
        "sampling": sampling.as_dict(),
        "seed": ctx.config.seed,
        "methods": {
            m.name: {**m.config.as_dict(), "drafter": m.drafter}
            | ({"drafter_digest": drafter_digest(drafters[m.name])} if m.name in drafters else {})
            for m in session.methods
        },
        "captions": ctx.config.captions,
    }
    run = RunDir(ctx.path / "sessions" / session.name, settings, command=COMMAND, outputs=())
    run.open_shared(ctx.shard, any_count=True)
    return run


def _save_round(run: RunDir, unit: tuple[str, dict], timing: pd.DataFrame, decodes: dict) -> None:
    """One round's part: its timing rows, step and image records per method, and tokens."""
    steps = pd.concat([_step_counts(d).assign(method=name) for name, d in decodes.items()], ignore_index=True)
    images = pd.concat([d.frames()[2].assign(method=name) for name, d in decodes.items()], ignore_index=True)
    run.write_part(
        *unit,
        tables={"timing": timing, "steps": steps, "images": images},
        tensors={"tokens": {name: d.tokens for name, d in decodes.items()}},
    )


def _untimed(ctx: Context, s: SessionData, rounds: list[int], drafters: dict, tables: dict, B: int, save) -> None:
    """Decode the untimed ``rounds`` in chunks of 16 batches of B, method by method, each method's
    chunk kept as a pending part until the chunk's round parts are written (``save(r, timing, decodes)``)."""
    model = ctx.model(s.session.model)
    for at in range(0, len(rounds), 16 * B):
        chunk = rounds[at : at + 16 * B]
        per_round: dict = {r: {} for r in chunk}
        pending = []
        for m in s.session.methods:
            rs = [r for r in chunk if m.rounds is None or r < m.rounds]
            if not rs:
                continue
            name, holds = f"pending_{rs[0]:05d}_{m.name}", {"method": m.name, "rounds": rs}
            pending.append(name)
            d = _read_pending(s.run.read_part(name, holds))
            if d is None:
                d = decode(
                    model,
                    [s.conditions[r] for r in rs],
                    m.config,
                    s.sampling,
                    drafters.get(m.name),
                    tables.get(m.name),
                    seed=ctx.config.seed,
                    indices=rs,
                    batch_size=B,
                    progress=ctx.progress,
                )
                _write_pending(s.run, name, holds, d)
            for r, one in zip(rs, d.split()):
                per_round[r][m.name] = one
        for r in chunk:
            save(r, pd.DataFrame(columns=list(TIMING_COLUMNS)), per_round[r])
        for name in pending:  # the chunk's round parts hold them now
            s.run.drop_part(name)


def _session_data(s: SessionData, parts: list) -> SessionData:
    """The session's data from every round's part, in round order."""
    cat = lambda key: pd.concat([p.tables[key] for p in parts], ignore_index=True)
    tokens = {
        m.name: torch.cat([p.tensors["tokens"][m.name] for p in parts if m.name in p.tensors["tokens"]])
        for m in s.session.methods
    }
    timed_parts = [p.tables["timing"] for p in parts if len(p.tables["timing"])]  # untimed rounds have none
    timing = (pd.concat(timed_parts, ignore_index=True) if timed_parts else pd.DataFrame(columns=list(TIMING_COLUMNS)))[
        list(TIMING_COLUMNS)
    ]
    return SessionData(s.session, s.run, s.sampling, s.conditions, timing, cat("steps"), cat("images"), tokens)


def run_session(ctx: Context, session: Session) -> Optional[SessionData]:
    """Run (or resume) ``session``; returns its data on the merging process, None on other shards."""
    model = ctx.model(session.model)
    sampling = sampling_for(ctx, session.model, session.temperature)
    speculative = [m for m in session.methods if m.config.speculative]
    drafters = {m.name: ctx.drafter(session.model, m.drafter) for m in speculative}
    run = _session_run(ctx, session, model, sampling, drafters)
    conditions = (
        generation_conditions(model, session.rounds, ctx.config.seed, None, ctx.config.captions)
        if model.kind != "text"
        else model.default_conditions(session.rounds, ctx.config.seed)
    )
    empty = pd.DataFrame()
    shell = SessionData(session, run, sampling, conditions, empty, empty, empty, {})
    configs = {m.name: m.config for m in session.methods}
    units = _round_units(session)
    mine = [r for r, done in shard_units(run, units, ctx.shard, load=False) if done is None]

    def save(r: int, timing: pd.DataFrame, decodes: dict) -> None:
        _save_round(run, units[r], timing, decodes)

    B = int(getattr(ctx.config, "batch_size", 1))
    timed = mine if B == 1 else [r for r in mine if r < ctx.config.timing_images]
    tables = neighbour_tables(model, configs, progress=ctx.bars) if mine else {}
    if timed:
        interleaved_timing(
            model,
            configs,
            sampling,
            conditions,
            [(r, 1) for r in range(session.rounds)],
            drafters,
            tables,
            seed=ctx.config.seed,
            progress=ctx.progress,
            only=timed,
            rounds_of={m.name: m.rounds for m in session.methods if m.rounds is not None},
            on_round=save,
            desc=session.name,
        )
    _untimed(ctx, shell, [r for r in mine if r not in set(timed)], drafters, tables, B, save)
    parts = assemble_units(run, units, ctx.shard, None, lambda part: part)  # the session's data are the parts'
    return None if parts is None else _session_data(shell, parts)


def _write_pending(run: RunDir, name: str, holds: dict, d: Decoded) -> None:
    """Keep one method's decode of a chunk of untimed rounds as the part ``name`` until the chunk's
    round parts are written: an interrupted session resumes without decoding it again."""
    steps, drafts, images = d.frames()
    run.write_part(
        name,
        holds,
        tables={"steps": steps, "drafts": drafts, "images": images},
        tensors={"tokens": {"tokens": d.tokens}},
    )


def _read_pending(part) -> Optional[Decoded]:
    """The decode :func:`_write_pending` kept (tables and tokens, as the round parts need them), or None."""
    if part is None:
        return None
    cols = lambda df: {c: df[c].to_numpy() for c in df.columns}
    t = part.tables
    return Decoded(part.tensors["tokens"]["tokens"], cols(t["steps"]), cols(t["drafts"]), cols(t["images"]))


def pixels(ctx: Context, data: SessionData, method: str, n: int, batch: int = 64) -> torch.Tensor:
    """The first ``n`` images of ``method`` decoded to pixels: (n, C, H, W) float32 in [0, 1]."""
    model = ctx.model(data.session.model)
    h, w = model.grid
    codes = data.tokens[method][:n]
    with torch.no_grad():
        return torch.cat(
            [
                model.decode_codes(codes[i : i + batch].view(-1, h, w).to(model.device)).float().cpu()
                for i in range(0, len(codes), batch)
            ]
        )


def quality(ctx: Context, data: SessionData, method: str, n: int) -> dict:
    """Quality metrics of the first ``n`` images of ``method`` (:func:`lantern.evaluate.score_images`
    with the run's extractors and reference), cached as a part of the session; {metric: value dict}."""
    run = data.run
    holds = {
        "method": method,
        "n": int(n),
        "extractors": list(ctx.config.extractors),
        "reference": ctx.config.reference,
        "intervals": "jackknife+wilson",
    }  # parts of the old bootstrap recompute
    name = f"quality_{method}_{n}"
    part = run.read_part(name, holds)
    if part is not None:
        return part.meta["scores"]
    model = ctx.model(data.session.model)
    scores = score_images(
        pixels(ctx, data, method, n),
        reference=ctx.config.reference,
        extractors=ctx.config.extractors,
        conditions=data.conditions[:n],
        class_names=model.class_names,
        data=ctx.config.data,
        device=ctx.device,
        label=method,
    )
    scores = {k: v for k, v in scores.items() if isinstance(v, dict) and "value" in v}
    run.write_part(name, holds, meta={"scores": _jsonable(scores)})
    return scores


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x
