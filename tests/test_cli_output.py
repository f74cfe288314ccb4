"""What commands print: paths by one rule (relative to the working directory when under it, else
absolute), the comparison table in aligned columns, and the note of a drafter run that ends inside
its learning-rate warm-up."""

import os

import torch
from safetensors.torch import save_file

from ambiguity.cli import print_written, shown_path
from ambiguity.compare import format_table
from lantern.drafter.train import TrainConfig, warmup_note
from lantern.drafter.train import main as train_main


def test_paths_print_relative_under_the_working_directory_else_absolute(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert shown_path(tmp_path / "runs" / "x" / "summary.json") == os.path.join("runs", "x", "summary.json")
    assert shown_path("runs/x") == os.path.join("runs", "x")
    assert shown_path("./runs/../runs/x") == os.path.join("runs", "x")
    assert shown_path(tmp_path.parent / "elsewhere") == str(tmp_path.parent / "elsewhere")
    print_written([tmp_path / "a.parquet", "b/c.json"], "; done")
    assert capsys.readouterr().out == "wrote a.parquet, b/c.json; done\n"


ROWS = [
    dict(
        model="embedded",
        kind="c2i",
        images=64,
        top1=0.2345,
        top1_lo=0.2,
        top1_hi=0.25,
        top10=0.61,
        top10_lo=0.6,
        top10_hi=0.62,
        entropy=3.14159,
        drafter_top1=0.542,
        drafter_epochs=4.98,
    ),
    dict(
        model="text-twin",
        kind="text",
        images=8,
        top1=0.5,
        top1_lo=0.4,
        top1_hi=0.6,
        top10=0.9,
        top10_lo=0.85,
        top10_hi=0.95,
        entropy=12.5,
    ),
]


def test_comparison_table_columns_line_up():
    """Columns as wide as their widest cell, two spaces apart (before: the entropy values ended two
    characters left of their header, the paper rows' columns one character right of theirs)."""
    lines = format_table(ROWS, paper=True).splitlines()
    assert lines == [
        "model             kind  images  top-1 [95% CI]        top-10 [95% CI]       entropy     drafter top-1",
        "-" * 101,
        "embedded          c2i       64  0.234 [0.200, 0.250]  0.610 [0.600, 0.620]     3.14  54.20% (ep 4.98)",
        "text-twin         text       8  0.500 [0.400, 0.600]  0.900 [0.850, 0.950]    12.50               n/a",
        "LlamaGen (paper)  t2i           0.206                 0.520                                    38.80%",
        "Anole (paper)     t2i           0.064                 0.204                                    27.60%",
    ]
    assert (
        format_table(ROWS, paper=False, level=0.9)
        .splitlines()[0]
        .startswith("model      kind  images  top-1 [90% CI]        top-10 [90% CI]")
    )


def test_warmup_note_when_training_ends_inside_the_warmup():
    config = TrainConfig(epochs=1)  # lr 1e-3, 100 warm-up steps
    assert warmup_note(5, config) == (
        "training took 5 optimiser steps, all inside the 100-step learning-rate warm-up (the rate reached "
        "5e-05 of its peak 0.001), so the drafter may stay near its random-init accuracy; train more --epochs "
        "or on more sequences"
    )  # the last of the 5 steps runs at 1e-3 * 5 / 100
    assert warmup_note(99, config).startswith("training took 99 optimiser steps")
    assert warmup_note(100, config) is None  # the warm-up ends at the last step
    assert warmup_note(0, config) is None


def test_a_small_drafter_run_notes_its_warmup_and_prints_relative_paths(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 1024, (16, 64), generator=g)
    save_file({"tokens": tokens, "labels": torch.arange(16) % 10}, str(tmp_path / "tokens.safetensors"))
    argv = ["--tokens", "tokens.safetensors", "--test-size", "4", "--epochs", "1", "--batch-size", "8"]
    assert train_main([*argv, "--run-dir", "run", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert (  # 12 training sequences in batches of 8: 2 steps, the last at 1e-3 * 2 / 100
        "note: training took 2 optimiser steps, all inside the 100-step learning-rate warm-up (the rate reached "
        "2e-05 of its peak 0.001), so the drafter may stay near its random-init accuracy; train more --epochs or "
        "on more sequences\n"
    ) in out
    assert "run dir run\n" in out
    assert (
        "wrote run/drafter.safetensors, run/drafter_accuracy.parquet, run/drafter_accuracy.png, "
        "run/drafter_accuracy.pdf (drafter " in out
    )
