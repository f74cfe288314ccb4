"""python -m lantern.paper: the --quick run end to end (every item, the report next to the published
values, resume without recomputation, the notebook), k mapping, and one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

from ambiguity.errors import UsageError
from ambiguity.runs import RunOptions
from lantern.paper import run_paper, select
from lantern.paper.config import QUICK, PaperConfig, map_to_codebook
from lantern.paper.experiments import EXPERIMENTS

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONWARNINGS": "ignore"}


def test_k_is_mapped_by_the_fraction_of_the_codebook():
    assert [map_to_codebook(k, 1024) for k in (100, 300, 1000, 2000)] == [6, 19, 62, 125]
    assert map_to_codebook(1000, 16384) == 1000  # the paper's own codebook: unchanged
    assert map_to_codebook(1, 1024) == 1 and map_to_codebook(20000, 1024) == 1023


def test_select_keeps_the_papers_order_and_refuses_unknown_names():
    assert select("table2,fig2a") == ["fig2a", "table2"]
    assert select(None) == list(EXPERIMENTS)
    with pytest.raises(UsageError, match="unknown experiment 'fig9'.*fig2a"):
        select("fig2a,fig9")


def _run(*args, check=True):
    p = subprocess.run(
        [sys.executable, "-m", "lantern.paper", *map(str, args)], capture_output=True, text=True, env=ENV, timeout=1200
    )
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def _one_line_error(p) -> str:
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


def test_bad_input_is_one_line(tmp_path):
    assert "choose from fig2a" in _one_line_error(_run("--only", "nope", "--out", tmp_path / "a", check=False))
    line = _one_line_error(_run("--models", "text-twin", "--only", "table2", "--out", tmp_path / "b", check=False))
    assert "no image model" in line
    assert "--grid-images" in _one_line_error(_run("--main-images", "3", "--grid-images", "5", check=False))
    assert not (tmp_path / "b").exists()  # nothing written before the inputs are valid


def test_model_without_drafter_or_codebook_names_the_fix(tmp_path, monkeypatch):
    import lantern.drafter.model
    from ambiguity.models.llamagen import LlamaGenModel

    config = PaperConfig(**{**QUICK, "models": ("embedded",)})
    monkeypatch.setattr(lantern.drafter.model, "shipped_drafter_path", lambda name: tmp_path / "none.safetensors")
    with pytest.raises(UsageError, match="python -m lantern.drafter.train"):
        run_paper(config, RunOptions(out=tmp_path / "r1", progress=False), only="table2")
    monkeypatch.undo()

    def no_codebook(self):
        raise NotImplementedError

    monkeypatch.setattr(LlamaGenModel, "codebook", no_codebook)
    with pytest.raises(UsageError, match="no VQ codebook"):
        run_paper(config, RunOptions(out=tmp_path / "r2", progress=False), only="fig5")
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_every_model_decodes_its_untimed_rounds_in_batches(tmp_path):
    """--batch-size 4 with embedded and text-twin (its slot cache keeps each prompt's own prefix):
    fig2a runs; both models' rounds after the first --timing-images are decoded in batches, with no
    batch-1 note in the report; round 0 alone is timed."""
    import pandas as pd

    config = PaperConfig(**{**QUICK, "batch_size": 4, "timing_images": 1, "models": ("embedded", "text-twin")})
    report = run_paper(config, RunOptions(out=tmp_path / "r", progress=False), only="fig2a").read_text()
    assert "rounds after the first" not in report  # no model fell back to batch 1
    for model in ("embedded", "text-twin"):
        parts = tmp_path / "r" / "sessions" / f"{model}-T1-eagle2" / "parts"
        timed = [len(pd.read_parquet(parts / f"round_{r:05d}.timing.parquet")) for r in range(QUICK["fig2a_images"])]
        assert timed == [1, 0, 0]  # EAGLE-2 (the session's one method) in round 0 only


def test_distortion_decodes_only_its_ar_pairs_session(tmp_path, monkeypatch):
    """--only distortion decodes AR alone, pairs_images rounds in the session <primary>-T1-pairs (not the
    whole temperature-1 session), whose images are plain AR decodes of the main session's first
    conditions and seeds; the report shows the drivers and intervals; the session resumes."""
    from types import SimpleNamespace

    import pandas as pd
    import torch

    import lantern.paper.sessions
    import lantern.timing
    from lantern.engine.decode import DecodeConfig, decode
    from lantern.paper.context import Context
    from lantern.paper.distortion_item import pairs_session

    methods = []

    def counting(real):
        def wrapped(model, conditions, config, *args, **kwargs):
            methods.append(config.method)
            return real(model, conditions, config, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(lantern.timing, "decode", counting(lantern.timing.decode))
    monkeypatch.setattr(lantern.paper.sessions, "decode", counting(lantern.paper.sessions.decode))
    import lantern.paper.distortion_item

    bars = []  # progress=False reaches the neighbour-table build (its bar shows by default from 8192 codes)

    def table_spy(model, config, **kwargs):
        bars.append(kwargs.get("progress"))
        return neighbour_table(model, config, **kwargs)

    neighbour_table = lantern.paper.distortion_item.neighbour_table
    monkeypatch.setattr(lantern.paper.distortion_item, "neighbour_table", table_spy)
    config = PaperConfig(**{**QUICK, "models": ("embedded",)})
    report = run_paper(config, RunOptions(out=tmp_path / "r", progress=False), only="distortion").read_text()
    assert methods and set(methods) == {"ar"}
    assert bars == [False]
    assert sorted(p.name for p in (tmp_path / "r" / "sessions").iterdir()) == ["embedded-T1-pairs"]
    rounds = sorted((tmp_path / "r" / "sessions" / "embedded-T1-pairs" / "parts").glob("round_*.json"))
    assert len(rounds) == QUICK["pairs_images"]
    df = pd.read_csv(tmp_path / "r" / "distortion" / "distortion_ours.csv")
    assert {"ci_low", "ci_high"} <= set(df.columns) and (df["positions"] == 4 * 63).all()
    for what in ("TVD(q, p)", "TVD(out, p)", "TVD(out, p), tree", "H(p)", "p top-1", "H(q)", "q top-1 = p top-1"):
        assert f"| {what}" in report, what
    tree = df[df["what"] == "TVD(out, p), tree"]  # the dynamic tree's top-10 siblings, within 10 δ
    assert len(tree) == len(df[df["what"] == "TVD(out, p)"]) and (tree["siblings"] == config.tree[2]).all()
    assert (tree["mean"] <= config.tree[2] * tree["delta"] + 1e-6).all()
    assert "4 AR samples" in report and "embedded-T1-pairs" in report

    def refuse(*args, **kwargs):
        raise AssertionError("a finished session decodes nothing")

    monkeypatch.setattr(lantern.timing, "decode", refuse)
    monkeypatch.setattr(lantern.paper.sessions, "decode", refuse)
    ctx = Context(config, SimpleNamespace(path=tmp_path / "r"), progress=False)
    data = pairs_session(ctx)  # resumed from its parts
    monkeypatch.undo()
    plain = decode(
        ctx.model("embedded"), data.conditions, DecodeConfig.of("ar"), data.sampling, seed=config.seed, indices=range(4)
    )
    assert torch.equal(data.tokens["ar"], plain.tokens)


def test_timing_note_names_the_timed_rounds_and_the_batch():
    from types import SimpleNamespace

    from lantern.paper.methods import timing_note

    ctx = SimpleNamespace(config=SimpleNamespace(batch_size=32, timing_images=50, compile=False), primary="embedded")
    assert timing_note(ctx, [(0.0, 20), (1.0, 5000)]) == [
        "temperature 0: speed-ups from the first 20 rounds, timed at batch 1, interleaved; "
        "statistics and quality over 20 images at batch 32.",
        "temperature 1: speed-ups from the first 50 rounds, timed at batch 1, interleaved; "
        "statistics and quality over 5000 images at batch 32.",
    ]
    ctx.config.batch_size = 1
    assert timing_note(ctx, [(1.0, 100)]) == []  # every round timed
    ctx.config.compile = True
    assert timing_note(ctx, [(1.0, 100)]) == [
        "compiled forwards (--compile): every method's target and drafter forwards ran through torch.compile; "
        "the compilation happened in the timing warm-up"
    ]


def test_compile_is_recorded_only_when_set_and_compiles_models_and_drafters(tmp_path):
    from lantern.paper.__main__ import build_parser, config_from_args
    from lantern.paper.context import Context

    assert "compile" not in PaperConfig().settings()  # runs recorded before --compile still resume
    config = config_from_args(build_parser().parse_args(["--quick", "--compile", "--models", "embedded"]))
    assert config.compile and config.settings()["compile"] is True
    ctx = Context(config=config, run=None)
    assert ctx.model("embedded").compiled is not None
    assert ctx.drafter("embedded").layer.compiled is not None
    assert ctx.drafter("embedded", "random-init").layer.compiled is not None
    # a transformers adapter runs eager only: refused before any weights load, nothing written
    line = _one_line_error(_run("--models", "anole,text-twin", "--compile", "--out", tmp_path / "a", check=False))
    assert "--compile" in line and "anole" in line
    assert not (tmp_path / "a").exists()


@pytest.mark.slow
def test_quick_run_regenerates_every_item_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "quick"
    first = _run("--quick", "--out", out, "--no-progress")
    report = (out / "report.md").read_text()
    assert "QUICK MODE" in report
    printed = {line.split()[0] for line in first.stdout.splitlines() if line.strip()}
    for name in EXPERIMENTS:
        assert name in printed, name
        folder = out / name
        assert folder.is_dir(), name
        for png in folder.glob("*.png"):
            assert png.with_suffix(".pdf").is_file()
        for csv in folder.glob("*.csv"):
            assert csv.with_suffix(".md").is_file()
    for title in (
        "Fig. 2a",
        "Fig. 2b",
        "Fig. 2c",
        "Fig. 3",
        "Fig. 4",
        "Fig. 5",
        "Table 2",
        "Table 3",
        "App. F.1",
        "App. F.2",
        "Distortion",
    ):
        assert f"## {title}" in report, title
    # the published values stand next to ours
    for value in ("0.206", "0.064", "0.388", "2.26", "1.69", "0.4781", "9.1", "23.91"):
        assert value in report, value
    # every decoding item ran on the same sessions: the temperature-1 session has main_images rounds
    rounds = sorted((out / "sessions" / "embedded-T1" / "parts").glob("round_*.json"))
    assert len(rounds) == QUICK["main_images"]
    # a rerun recomputes nothing; losing one item recomputes that item from the kept decoding rounds
    stamps = {p: p.stat().st_mtime_ns for p in rounds}
    second = _run("--quick", "--out", out, "--no-progress")
    assert second.stdout.count("resumed") == len(EXPERIMENTS)
    for f in (out / "parts").glob("item_table2.*"):
        f.unlink()
    third = _run("--quick", "--out", out, "--no-progress", "--only", "table2,f1")
    assert third.stdout.count("resumed") == 1 and "table2" in third.stdout
    assert {p: p.stat().st_mtime_ns for p in rounds} == stamps  # no decoding round was redone
    # other settings in the same directory are refused with one line
    assert "--overwrite" in _one_line_error(_run("--quick", "--seed", "1", "--out", out, check=False))

    # the notebook shows this run (cells executed in-process)
    import matplotlib.pyplot as plt

    monkeypatch.setenv("LANTERN_PAPER_RUN", str(out))
    monkeypatch.chdir(tmp_path)
    nb = json.loads((ROOT / "notebooks" / "paper.ipynb").read_text())
    ns: dict = {}
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        exec(compile("".join(cell["source"]), f"paper.ipynb[cell {i}]", "exec"), ns)
    plt.close("all")
    assert ns["RUN"] == out and len(ns["t2"]) == 6


def test_interrupted_batched_session_keeps_each_finished_method(tmp_path, monkeypatch):
    """An untimed chunk is decoded method by method; each method's decode is kept as a pending part, so
    a session interrupted in the third method resumes with the others only, gives the tokens of an
    uninterrupted run, and leaves no pending part behind."""
    import torch
    from safetensors.torch import load_file

    import lantern.paper.sessions as sessions

    real, calls = sessions.decode, []

    class Stop(Exception):
        pass

    def counting(stop_at):
        def wrapped(model, conditions, config, *args, **kwargs):
            calls.append(json.dumps(config.as_dict(), sort_keys=True, default=str))
            if len(calls) == stop_at:
                raise Stop
            return real(model, conditions, config, *args, **kwargs)

        return wrapped

    config = PaperConfig(**{**QUICK, "batch_size": 4, "timing_images": 1, "models": ("embedded",)})
    monkeypatch.setattr(sessions, "decode", counting(3))
    with pytest.raises(Stop):
        run_paper(config, RunOptions(out=tmp_path / "r", progress=False), only="fig5")
    parts = tmp_path / "r" / "sessions" / "embedded-T1" / "parts"
    assert len(list(parts.glob("pending_00001_*.json"))) == 2 and not (parts / "round_00001.json").exists()
    first_two = calls[:2]
    calls.clear()
    monkeypatch.setattr(sessions, "decode", counting(0))
    run_paper(config, RunOptions(out=tmp_path / "r", progress=False), only="fig5")
    resumed = list(calls)
    assert not list(parts.glob("pending_*"))

    calls.clear()
    run_paper(config, RunOptions(out=tmp_path / "whole", progress=False), only="fig5")
    assert len(calls) > 3 and sorted(resumed + first_two) == sorted(calls)  # each method decoded once in all
    whole = tmp_path / "whole" / "sessions" / "embedded-T1" / "parts"
    for r in range(QUICK["main_images"]):
        a, b = (load_file(p / f"round_{r:05d}.tokens.safetensors") for p in (parts, whole))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_resumed_run_loads_only_what_its_unfinished_items_need(tmp_path, monkeypatch):
    """A finished run resumes without loading any model (their digests were recorded); an unfinished
    item loads its model, whose digest is checked against the record as it loads."""
    import lantern.paper.context
    from ambiguity.models.base import TokenModel

    config = PaperConfig(**{**QUICK, "models": ("embedded",)})
    opts = RunOptions(out=tmp_path / "r", progress=False)
    run_paper(config, opts, only="distortion")
    record = json.loads((tmp_path / "r" / "run.json").read_text())["settings"]["weights_digest"]
    assert set(record) == {"embedded", "embedded drafter"}

    def refuse(*args, **kwargs):
        raise AssertionError("a finished run loads no model")

    monkeypatch.setattr(lantern.paper.context, "load_model", refuse)
    assert "## Distortion" in run_paper(config, opts, only="distortion").read_text()
    monkeypatch.undo()
    for f in (tmp_path / "r" / "parts").glob("item_distortion.*"):
        f.unlink()
    monkeypatch.setattr(TokenModel, "weights_digest", lambda self: "0123456789abcdef")
    with pytest.raises(UsageError, match="the weights of embedded changed since .* 0123456789abcdef now"):
        run_paper(config, opts, only="distortion")
