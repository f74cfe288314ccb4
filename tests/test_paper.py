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
from lantern.paper import EXPERIMENTS, QUICK, PaperConfig, run_paper, select
from lantern.paper.config import map_to_codebook

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
    import lantern.drafter
    from ambiguity.models.llamagen import LlamaGenModel

    config = PaperConfig(**{**QUICK, "models": ("embedded",)})
    monkeypatch.setattr(lantern.drafter, "shipped_drafter_path", lambda name: tmp_path / "none.safetensors")
    with pytest.raises(UsageError, match="python -m lantern.train_drafter"):
        run_paper(config, tmp_path / "r1", only="table2", progress=False)
    monkeypatch.undo()

    def no_codebook(self):
        raise NotImplementedError

    monkeypatch.setattr(LlamaGenModel, "codebook", no_codebook)
    with pytest.raises(UsageError, match="no VQ codebook"):
        run_paper(config, tmp_path / "r2", only="fig5", progress=False)
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


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
