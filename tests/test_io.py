"""ambiguity.io: atomic writes give results the mode a plain open() would."""

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
