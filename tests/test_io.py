"""ambiguity.io: atomic writes give results the mode a plain open() would, in a directory they create."""

import os
import stat

import pandas as pd
import torch

from ambiguity.io import save_tensors, write_json, write_table


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_saved_files_get_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        files = [
            save_tensors({"w": torch.zeros(2)}, tmp_path / "w.safetensors", {"epochs": 0.5}),
            write_json({"a": 1}, tmp_path / "a.json"),
            write_table(pd.DataFrame({"x": [1]}), tmp_path / "t.csv"),
        ]
        assert [_mode(f) for f in files] == [0o644] * 3
        os.umask(0o027)
        assert _mode(save_tensors({"w": torch.zeros(2)}, tmp_path / "v.safetensors")) == 0o640
    finally:
        os.umask(old)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_writes_create_the_missing_directory(tmp_path):
    """A result's directory is created at the write, so a run whose --out names a new folder does
    not fail after its work is done (benchmarks/probe_distortion.py did)."""
    path = write_json({"a": 1}, tmp_path / "new" / "deeper" / "a.json")
    assert path.read_text().strip().startswith("{") and path.parent.is_dir()
