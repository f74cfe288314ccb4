"""Scale-out (issue 13): the same commands under torchrun (gloo, 2 processes) and as independent
shards equal a single-process run row for row; killed shards rerun; merges refuse parts that do
not belong; bad shard options are one-line usage errors.

Every command runs in a subprocess with ``OMP_NUM_THREADS=1`` so that the single-process
reference and each shard use the same CPU kernels (see ambiguity.distributed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from ambiguity.distributed import SINGLE, Shard, setup_shards
from ambiguity.errors import UsageError

pytestmark = pytest.mark.slow

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
TIMING = ("_s",)  # timing columns differ between runs by nature


def run(*argv, torchrun: bool = False, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m <argv>``, or the same under ``torchrun --standalone --nproc_per_node 2``."""
    cmd = [sys.executable, "-m"]
    if torchrun:
        cmd += ["torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"]
    proc = subprocess.run(cmd + [str(a) for a in argv], capture_output=True, text=True, env=ENV, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def usage_error(proc: subprocess.CompletedProcess) -> str:
    """The single stderr line of a usage error (exit 2, no traceback)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def table(path: Path) -> pd.DataFrame:
    df = pd.read_parquet(path)
    return df[[c for c in df.columns if not c.endswith(TIMING)]]


def part_files(run_dir: Path, skip: tuple = ("checkpoint",)) -> dict:
    """{part name: its files' sha256} from the manifests (what a part holds, byte for byte)."""
    out = {}
    for manifest in sorted((run_dir / "parts").glob("*.json")):
        if manifest.stem.startswith(skip):
            continue
        files = json.loads(manifest.read_text())["files"]
        out[manifest.stem] = {name: f["sha256"] for name, f in files.items()}
    return out


PROFILE = ("ambiguity.profile", "--num-images", 6, "--batch-size", 2, "--no-figures", "--no-progress")
GENERATE = ("lantern.generate", "--num-images", 3, "--gamma", 3, "--no-progress")
DRAFTER = (
    "lantern.drafter.train",
    "--self-generate",
    12,
    "--gen-batch-size",
    4,
    "--test-size",
    4,
    "--epochs",
    1,
    "--batch-size",
    4,
    "--cfg",
    2,
    "--no-progress",
)


# --------------------------------------------------------------------------- torchrun = one process
def test_profile_under_torchrun_equals_one_process(tmp_path):
    run(*PROFILE, "--out", tmp_path / "one")
    run(*PROFILE, "--out", tmp_path / "two", torchrun=True)
    pd.testing.assert_frame_equal(
        table(tmp_path / "one" / "tokens.parquet"), table(tmp_path / "two" / "tokens.parquet")
    )
    one, two = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two"))
    assert one["stats"] == two["stats"] and one["tokens"] == two["tokens"] == 6 * 64
    assert json.loads((tmp_path / "two" / "run.json").read_text())["shards"] == 2


def test_generate_under_torchrun_equals_one_process(tmp_path):
    run(*GENERATE, "--out", tmp_path / "one")
    run(*GENERATE, "--out", tmp_path / "two", torchrun=True)
    for name in ("images.parquet", "drafts.parquet", "steps.parquet"):
        pd.testing.assert_frame_equal(table(tmp_path / "one" / name), table(tmp_path / "two" / name))


def test_drafter_data_and_ddp_training_under_torchrun(tmp_path):
    """Self-generated sequences and teacher-forced features are identical byte for byte; one
    epoch of DistributedDataParallel training equals one process up to reduction order."""
    run(*DRAFTER, "--run-dir", tmp_path / "one")
    run(*DRAFTER, "--run-dir", tmp_path / "two", torchrun=True)
    one, two = part_files(tmp_path / "one"), part_files(tmp_path / "two")
    assert one == two
    assert {"selfgen_00000", "selfgen_00001", "selfgen_00002", "tokens_train", "train_features_00000"} <= set(one)
    a, b = (load_file(tmp_path / d / "drafter_epoch001.safetensors") for d in ("one", "two"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    acc = [pd.read_parquet(tmp_path / d / "accuracy.parquet") for d in ("one", "two")]
    assert acc[0]["top1"].tolist() == acc[1]["top1"].tolist()
    assert acc[0]["train_rows"].tolist() == acc[1]["train_rows"].tolist()


EVALUATE = (
    "lantern.evaluate",
    "fashion-mnist:train@40",
    "--extractors",
    "fmnist",
    "--batch-size",
    2,
    "--bootstrap",
    20,
    "--no-progress",
)
METRICS = ["metric", "value", "ci_low", "ci_high", "n"]


def test_evaluate_sharded_equals_one_process(tmp_path):
    """Feature chunks (whole extractor batches) split over torchrun ranks or independent shards
    give the single process's metrics and intervals exactly."""
    run(*EVALUATE, "--out", tmp_path / "one")
    run(*EVALUATE, "--out", tmp_path / "two", torchrun=True)
    for i in (1, 0):
        run(*EVALUATE, "--out", tmp_path / "ind", "--shard-index", i, "--num-shards", 2)
    run("ambiguity", "merge", tmp_path / "ind")
    one = pd.read_parquet(tmp_path / "one" / "metrics.parquet")[METRICS]
    for d in ("two", "ind"):
        pd.testing.assert_frame_equal(one, pd.read_parquet(tmp_path / d / "metrics.parquet")[METRICS])


def test_paper_items_under_torchrun_equal_one_process(tmp_path):
    args = ("lantern.paper", "--quick", "--only", "fig2a", "--no-progress")
    run(*args, "--out", tmp_path / "one")
    run(*args, "--out", tmp_path / "two", torchrun=True)
    cols = ["model", "temperature", "images", "tau", "tokens_per_forward", "acceptance_rate"]
    pd.testing.assert_frame_equal(
        pd.read_csv(tmp_path / "one" / "fig2a" / "fig2a_ours.csv")[cols],
        pd.read_csv(tmp_path / "two" / "fig2a" / "fig2a_ours.csv")[cols],
    )


# --------------------------------------------------------------------------- independent shards
def test_independent_shards_killed_shard_rerun_and_merge(tmp_path):
    ref, out = tmp_path / "ref", tmp_path / "sharded"
    run(*PROFILE, "--out", ref)
    shard = lambda i, **kw: run(*PROFILE, "--out", out, "--shard-index", i, "--num-shards", 2, **kw)
    done = shard(0)
    assert "shard 1/2 done" in done.stdout and "python -m ambiguity merge" in done.stdout
    assert not (out / "tokens.parquet").exists()
    # merging before shard 1 ran names the missing part
    line = usage_error(run("ambiguity", "merge", out, "--no-figures", check=False))
    assert "batch_00001" in line and "--shard-index" in line
    # shard 1 is killed while writing: a temporary file is left behind and its part is torn
    shard(1)
    (out / "parts" / "batch_00001.tokens.parquet").write_bytes(b"PAR1 torn by a kill")
    (out / "parts" / ".batch_00001.tokens.parquet.x1y2.tmp").write_bytes(b"half")
    assert "batch_00001" in usage_error(run("ambiguity", "merge", out, "--no-figures", check=False))
    rerun = shard(1)  # the rerun recomputes only the torn part
    assert "batch_00001" in rerun.stderr
    run("ambiguity", "merge", out, "--no-figures")
    pd.testing.assert_frame_equal(table(ref / "tokens.parquet"), table(out / "tokens.parquet"))
    assert (
        json.loads((ref / "summary.json").read_text())["stats"]
        == json.loads((out / "summary.json").read_text())["stats"]
    )


def test_merge_refuses_parts_of_other_settings(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for i in (0, 1):
        run(*PROFILE, "--out", a, "--shard-index", i, "--num-shards", 2)
    run(*PROFILE, "--seed", 1, "--out", b)
    # a part computed under other settings (seed 1) is copied over one of a's parts
    for f in (b / "parts").glob("batch_00002.*"):
        shutil.copy(f, a / "parts" / f.name)
    line = usage_error(run("ambiguity", "merge", a, "--no-figures", check=False))
    assert "batch_00002" in line
    assert not (a / "tokens.parquet").exists()


def test_shard_options_errors(tmp_path):
    out = tmp_path / "run"
    run(*PROFILE, "--out", out, "--shard-index", 0, "--num-shards", 2)
    # a shard of other settings joining the run
    line = usage_error(run(*PROFILE, "--seed", 3, "--out", out, "--shard-index", 1, "--num-shards", 2, check=False))
    assert "--overwrite" in line or "another --out" in line
    # the world size changes between the run and its resume
    line = usage_error(run(*PROFILE, "--out", out, "--shard-index", 1, "--num-shards", 3, check=False))
    assert "2 shard(s)" in line
    line = usage_error(run(*PROFILE, "--out", out, check=False))
    assert "2 shard(s)" in line
    # nothing was lost: shard 0's part is intact
    assert (out / "parts" / "batch_00000.json").is_file() and (out / "parts" / "batch_00002.json").is_file()
    usage_error(run(*PROFILE, "--out", out, "--shard-index", 2, "--num-shards", 2, check=False))
    usage_error(run(*PROFILE, "--out", out, "--shard-index", 1, check=False))
    usage_error(run(*PROFILE, "--out", out, "--shard-index", 1, "--num-shards", 2, "--overwrite", check=False))
    usage_error(run("ambiguity", "merge", tmp_path, check=False))
    usage_error(
        run("lantern.drafter.train", "--run-dir", tmp_path / "d", "--shard-index", 0, "--num-shards", 2, check=False)
    )


# --------------------------------------------------------------------------- in-process units
def test_setup_shards_and_ownership(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert setup_shards() is SINGLE and SINGLE.merges and SINGLE.owns(5)
    s = setup_shards(1, 3)
    assert (s.index, s.count, s.group, s.merges) == (1, 3, False, False)
    assert [u for u in range(8) if s.owns(u)] == [1, 4, 7]
    assert s.all_sum(torch.ones(2)).tolist() == [1.0, 1.0]  # no group: the shard's own values
    for bad in ((3, 3), (0, None), (None, 2), (-1, 2)):
        with pytest.raises(UsageError):
            setup_shards(*bad)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match="torchrun"):
        setup_shards(0, 2)
    assert Shard(0, 2, True).merges and not Shard(0, 2, False).merges
