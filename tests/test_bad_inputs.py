"""Every entry point against a table of bad inputs (issue 15): one ``error:`` line, exit 2, no traceback.

Each case of :data:`CASES` (457 of them: ``python tests/test_bad_inputs.py`` runs them all and
prints the tally) runs one command in its own process, ``python -m <module>`` or ``python
<script>``, with ``OMP_NUM_THREADS=1``, no visible GPU (the same verdicts on every machine) and an
empty Hugging Face cache, in a fresh directory (also its working directory, so default outputs
land there) after an optional ``setup`` that writes the bad files. The case passes when

* the exit status is 2,
* stderr holds no ``Traceback``,
* the non-empty stderr lines, after dropping progress-bar output (tqdm redraws, should a
  command without ``--no-progress`` draw one), are zero or more ``note:`` lines followed by
  exactly one ``error:`` line. Notes are allowed because a command may say what it did before it
  met the bad input (e.g. "part X is not reused: ...; recomputing it"); anything else (a
  warning, a second error line, a stray print) fails the case;
* the error line contains ``expect`` when the case gives one (the fix it must name).

Classes covered for every command: damaged, swapped, foreign or missing weights and data files
(also valid files holding NaN / Inf, another embedded variant's files under this one's names);
numbers that are zero, negative, huge (sizes checked against memory up front), NaN or infinite;
bad enums, lists and devices; outputs that are files, below files or unusable; damaged or foreign
runs given as input. Most cases fail on their options before a model loads; the others load the
shipped embedded model with tiny settings.

Speed: the processes are forked from a warm interpreter that has imported torch and the other
heavy libraries once (``tests/cli_launcher.py``; each child still imports this package and runs
the command as ``python -m`` would, with its own cwd, environment, stdout and stderr, and an
address-space limit so that a missed size check fails the case instead of the machine). Set
``BAD_INPUTS_FRESH=1`` to start a fresh interpreter per case instead (about 10 times slower, the
same verdicts). Selecting cases with ``-k`` runs only those.
"""

from __future__ import annotations

import gzip
import json
import os
import queue
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
AW = ROOT / "ambiguity" / "weights"
LW = ROOT / "lantern" / "weights"
LLAMAGEN = ROOT / "tests" / "fixtures" / "reference" / "llamagen"
TIMEOUT = 240
TQDM = re.compile(r"\d+%\||\|\s*\d+/\d+|\d+(\.\d+)?(it|img|tok|s)/s\]|it/s\]")


# --------------------------------------------------------------------------- the case type
@dataclass
class Case:
    """One bad input: ``target`` (a module run with ``-m``, or a path under the repository ending
    in ``.py``), its arguments (``{tmp}`` is the case's directory), an optional ``setup(tmp)``
    that writes bad files, and an optional substring of the error line."""

    id: str
    target: str
    args: list
    setup: Optional[Callable[[Path], None]] = None
    expect: Optional[str] = None
    base: bool = True  # prepend the command's usual safe options (--no-progress, --out in tmp)

    def argv(self, tmp: Path) -> list[str]:
        head = (
            [sys.executable, str(ROOT / self.target)]
            if self.target.endswith(".py")
            else [sys.executable, "-m", *self.target.split()]
        )
        args = (BASE.get(self.target, []) if self.base else []) + list(self.args)
        return head + [str(a).replace("{tmp}", str(tmp)) for a in args]


# options every case of a command starts with (argparse keeps the last of a repeated option,
# so a case that tests --out simply passes it again)
BASE = {
    "ambiguity.profile": ["--no-progress", "--out", "{tmp}/out"],
    "ambiguity.neighbourhood": ["--out", "{tmp}/out/nb.parquet", "--cache-dir", "{tmp}/cache"],
    "ambiguity.analyses concentration": ["--no-progress", "--out", "{tmp}/out", "--cache-dir", "{tmp}/cache"],
    "ambiguity.analyses interchangeability": ["--no-progress", "--out", "{tmp}/out", "--cache-dir", "{tmp}/cache"],
    "ambiguity.compare": ["--no-progress", "--out", "{tmp}/out"],
    "lantern.drafter.comparison": ["--no-progress", "--out", "{tmp}/out"],
    "lantern.generate": ["--no-progress", "--out", "{tmp}/out"],
    "lantern.replay": ["--out", "{tmp}/out"],
    "lantern.evaluate": ["--no-progress", "--out", "{tmp}/out", "--cache", "{tmp}/cache"],
    "lantern.drafter.train": ["--no-progress", "--run-dir", "{tmp}/run"],
    "scripts/figure_embedded_samples.py": ["--out", "{tmp}/out/fig"],
    "scripts/train_embedded.py": ["--no-progress", "--quick", "--out", "{tmp}/out", "--run-dir", "{tmp}/run"],
    "scripts/train_fmnist_classifier.py": ["--quick", "--out", "{tmp}/out", "--run-dir", "{tmp}/run"],
    "scripts/train_text_twin.py": ["--no-progress", "--quick", "--out", "{tmp}/out", "--run-dir", "{tmp}/run"],
    "benchmarks/bench_acceptance.py": ["--out", "{tmp}/out/acc.json"],
    "benchmarks/bench_decoding.py": ["--out", "{tmp}/out", "--figure", "{tmp}/fig/sweep"],
    "benchmarks/bench_neighbourhood.py": ["--out", "{tmp}/out/nb.json"],
    "benchmarks/bench_scaleout.py": ["--out", "{tmp}/out/scale.json"],
    "benchmarks/probe_distortion.py": ["--out", "{tmp}/out/dist.json"],
    "benchmarks/probe_emitted_tokens.py": ["--out", "{tmp}/out/emitted.csv"],
    "benchmarks/bench_distortion.py": ["--out", "{tmp}/out/cost.json"],
    "benchmarks/bench_throughput.py": ["--out", "{tmp}/out", "--repeats", "1", "--images", "1"],
}


# --------------------------------------------------------------------------- bad files
def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def truncated(src: Path, dst: Path, keep: float = 0.5) -> Path:
    """The first ``keep`` share of ``src``'s bytes at ``dst``."""
    data = src.read_bytes()
    return write(dst, data[: int(len(data) * keep)])


def below_file(tmp: Path) -> None:
    """``{tmp}/file`` is a plain file, so ``{tmp}/file/sub`` lies below a file."""
    write(tmp / "file", "x")


def embedded_weights(change: Callable[[Path], None]) -> Callable[[Path], None]:
    """A setup: a copy of the shipped embedded weights in ``{tmp}/w``, then ``change(dir)``."""

    def setup(tmp: Path) -> None:
        d = tmp / "w"
        d.mkdir(parents=True)
        for f in ("fashion_gpt.safetensors", "fashion_vq.safetensors"):
            shutil.copy(AW / f, d / f)
        change(d)

    return setup


def swap_weights(d: Path) -> None:
    gpt, vq = d / "fashion_gpt.safetensors", d / "fashion_vq.safetensors"
    tmp = d / "x"
    gpt.rename(tmp)
    vq.rename(gpt)
    tmp.rename(vq)


def nan_in(file: str, key: str, value: float = float("nan")) -> Callable[[Path], None]:
    """A change for :func:`embedded_weights` (or a drafter copy): tensor ``key`` of ``file`` set to
    ``value`` everywhere, the file otherwise valid (same metadata)."""

    def change(d: Path) -> None:
        import torch

        from ambiguity.io import load_tensors, save_tensors

        t, meta = load_tensors(d / file)
        t[key] = torch.full_like(t[key], value)
        save_tensors(t, d / file, meta)

    return change


def other_variant(src_prefix: str, dst_prefix: str) -> Callable[[Path], None]:
    """A setup: ``{tmp}/w`` holding the shipped ``<src_prefix>_*`` files under ``<dst_prefix>_*`` names."""

    def setup(tmp: Path) -> None:
        d = tmp / "w"
        d.mkdir(parents=True)
        for part in ("gpt", "vq"):
            shutil.copy(AW / f"{src_prefix}_{part}.safetensors", d / f"{dst_prefix}_{part}.safetensors")

    return setup


def nan_drafter(tmp: Path) -> None:
    """A setup: ``{tmp}/d.safetensors``, the shipped drafter with every weight NaN."""
    import torch

    from ambiguity.io import load_tensors, save_tensors

    t, meta = load_tensors(LW / "embedded_drafter.safetensors")
    save_tensors(
        {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in t.items()},
        tmp / "d.safetensors",
        meta,
    )


def idx_dir(kind: str) -> Callable[[Path], None]:
    """A setup: ``{tmp}/fm`` with Fashion-MNIST files of one kind of damage."""

    def setup(tmp: Path) -> None:
        d = tmp / "fm"
        d.mkdir(parents=True)
        names = (
            "train-images-idx3-ubyte",
            "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte",
            "t10k-labels-idx1-ubyte",
        )
        real = Path("/usr/share/datasets/fashion-mnist")
        for n in names:
            if kind == "garbage-gz":
                write(d / f"{n}.gz", b"this is not gzip data at all" * 10)
            elif kind == "truncated-gz":
                src = real / f"{n}.gz"
                blob = src.read_bytes() if src.is_file() else gzip.compress(_idx_blob(n, 50))
                write(d / f"{n}.gz", blob[: len(blob) // 2])
            elif kind == "truncated-raw":
                write(d / n, _idx_blob(n, 20)[:-7])
            elif kind == "bad-magic":
                write(d / n, b"\x01\x02")
            elif kind == "empty":
                write(d / n, b"")
            elif kind == "header-only":
                write(d / n, bytes([0, 0, 8, 3]) + b"\x00\x00")
            elif kind == "huge-dims":
                write(d / n, bytes([0, 0, 8, 3]) + (0xFFFFFFFF).to_bytes(4, "big") * 3 + b"\x00" * 16)
            elif kind == "mismatch":
                write(d / n, _idx_blob(n, 20 if "images" in n else 7))
            elif kind == "text":
                write(d / n, "hello, I am a text file\n" * 4)

    return setup


def _idx_blob(name: str, n: int) -> bytes:
    if "images" in name:
        return bytes([0, 0, 8, 3]) + n.to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + bytes(n * 784)
    return bytes([0, 0, 8, 1]) + n.to_bytes(4, "big") + bytes(n)


def token_file(kind: str) -> Callable[[Path], None]:
    """A setup: ``{tmp}/tokens.<ext>`` of one kind of damage for ``train_drafter --tokens``."""

    def setup(tmp: Path) -> None:
        import numpy as np
        import torch
        from safetensors.torch import save_file

        if kind == "garbage":
            write(tmp / "tokens.safetensors", b"garbage" * 20)
        elif kind == "truncated":
            save_file(
                {"tokens": torch.zeros(40, 64, dtype=torch.long), "labels": torch.zeros(40, dtype=torch.long)},
                str(tmp / "full.safetensors"),
            )
            truncated(tmp / "full.safetensors", tmp / "tokens.safetensors")
        elif kind == "shape":
            np.save(tmp / "tokens.npy", np.zeros((5,), dtype=np.int64))
        elif kind == "length":
            save_file(
                {"tokens": torch.zeros(40, 65, dtype=torch.long), "labels": torch.zeros(40, dtype=torch.long)},
                str(tmp / "tokens.safetensors"),
            )
        elif kind == "range":
            save_file(
                {"tokens": torch.full((40, 64), 5000, dtype=torch.long), "labels": torch.zeros(40, dtype=torch.long)},
                str(tmp / "tokens.safetensors"),
            )
        elif kind == "labels":
            save_file(
                {"tokens": torch.zeros(40, 64, dtype=torch.long), "labels": torch.full((40,), 77)},
                str(tmp / "tokens.safetensors"),
            )
        elif kind == "float":
            save_file(
                {"tokens": torch.rand(40, 64), "labels": torch.zeros(40, dtype=torch.long)},
                str(tmp / "tokens.safetensors"),
            )
        elif kind == "pickle":
            torch.save({"tokens": [1, 2, 3]}, tmp / "tokens.pt")
        elif kind == "npz":
            np.savez(tmp / "tokens.npz", other=np.zeros(3))

    return setup


def captions(text: str | bytes, name: str = "caps.txt") -> Callable[[Path], None]:
    return lambda tmp: write(tmp / name, text)


def files(**contents) -> Callable[[Path], None]:
    """A setup writing ``{tmp}/<name>`` = content for each keyword (``__`` stands for ``.``)."""

    def setup(tmp: Path) -> None:
        for name, data in contents.items():
            write(tmp / name.replace("__", "."), data)

    return setup


def both(*setups) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        for s in setups:
            s(tmp)

    return setup


# --------------------------------------------------------------------------- runs to damage
class Shared:
    """Finished runs built once per session (lazily, under a lock) that setups copy and damage."""

    def __init__(self, root: Path):
        self.root, self.lock, self._cache = root, threading.Lock(), {}

    def _build(self, name: str, argv: list[str]) -> Path:
        with self.lock:
            if name not in self._cache:
                out = self.root / name
                proc = subprocess.run(
                    [sys.executable, "-m", *argv, "--out", str(out)],
                    capture_output=True,
                    text=True,
                    env=_env(self.root),
                    cwd=self.root,
                    timeout=TIMEOUT,
                )
                assert proc.returncode == 0, proc.stderr[-2000:]
                self._cache[name] = out
            return self._cache[name]

    def generate(self) -> Path:
        return self._build(
            "gen", ["lantern.generate", "--num-images", "2", "--gamma", "2", "--k", "8", "--no-progress"]
        )

    def generate16(self) -> Path:
        """One AR image of embedded-16 (16 x 16 tokens, 64 px): another geometry than :meth:`generate`."""
        return self._build(
            "gen16",
            ["lantern.generate", "--model", "embedded-16", "--method", "ar", "--num-images", "1", "--no-progress"],
        )

    def profile_shard(self) -> Path:
        """Shard 0 of 2 of a profile run: the merge lacks shard 1's part."""
        return self._build(
            "prof",
            [
                "ambiguity.profile",
                "--num-images",
                "2",
                "--batch-size",
                "1",
                "--no-figures",
                "--no-progress",
                "--num-shards",
                "2",
                "--shard-index",
                "0",
            ],
        )


SHARED: Optional[Shared] = None


def gen_run(damage: Optional[Callable[[Path], None]] = None, name: str = "run") -> Callable[[Path], None]:
    """A setup: a copy of a finished 2-image generate run at ``{tmp}/<name>``, then ``damage(dir)``."""

    def setup(tmp: Path) -> None:
        shutil.copytree(SHARED.generate(), tmp / name)
        if damage is not None:
            damage(tmp / name)

    return setup


def gen16_run(tmp: Path) -> None:
    shutil.copytree(SHARED.generate16(), tmp / "run16")


def prof_shard_run(tmp: Path) -> None:
    shutil.copytree(SHARED.profile_shard(), tmp / "run")


def truncate_file(rel: str) -> Callable[[Path], None]:
    return lambda d: truncated(d / rel, d / rel)


def replace_file(rel: str, data: str | bytes) -> Callable[[Path], None]:
    return lambda d: write(d / rel, data)


def remove_file(rel: str) -> Callable[[Path], None]:
    return lambda d: (d / rel).unlink()


def edit_json(rel: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(d: Path) -> None:
        obj = json.loads((d / rel).read_text())
        change(obj)
        (d / rel).write_text(json.dumps(obj))

    return damage


def llamagen_pair(gpt: Optional[Callable[[Path], None]] = None) -> Callable[[Path], None]:
    """A setup: ``{tmp}/lg/c2i_B_256.pt`` written by ``gpt(path)`` (official-layout checkpoints)."""

    def setup(tmp: Path) -> None:
        (tmp / "lg").mkdir(parents=True)
        gpt(tmp / "lg" / "c2i_B_256.pt")

    return setup


# --------------------------------------------------------------------------- the table
HUGE = str(10**12)
BIG_SEED = str(2**64)
NO_GPU = "cuda:99"  # absent on CPU machines and on GPU machines alike
C = Case
P, N, CO, IN = (
    "ambiguity.profile",
    "ambiguity.neighbourhood",
    "ambiguity.analyses concentration",
    "ambiguity.analyses interchangeability",
)
G, R, E, T = "lantern.generate", "lantern.replay", "lantern.evaluate", "lantern.drafter.train"
FIG, TE, TF, TT = (
    "scripts/figure_embedded_samples.py",
    "scripts/train_embedded.py",
    "scripts/train_fmnist_classifier.py",
    "scripts/train_text_twin.py",
)
BA, BD, BN, BS, PD = (
    "benchmarks/bench_acceptance.py",
    "benchmarks/bench_decoding.py",
    "benchmarks/bench_neighbourhood.py",
    "benchmarks/bench_scaleout.py",
    "benchmarks/probe_distortion.py",
)
EMB_W = ["--weights", "{tmp}/w"]
TRUNC_GPT = embedded_weights(lambda d: truncated(d / "fashion_gpt.safetensors", d / "fashion_gpt.safetensors"))
TEXT_GPT = embedded_weights(lambda d: write(d / "fashion_gpt.safetensors", "not weights\n"))
EMPTY_VQ = embedded_weights(lambda d: write(d / "fashion_vq.safetensors", b""))
SWAPPED = embedded_weights(swap_weights)
TRUNC_DRAFTER = lambda tmp: truncated(LW / "embedded_drafter.safetensors", tmp / "d.safetensors")
CAPS = captions("a photo of a cat\na dog\n")

CASES: list[Case] = [
    # ---------------------------------------------------------------- package dispatchers
    C("amb-unknown-command", "ambiguity", ["bogus"], expect="unknown command"),
    C("lantern-unknown-command", "lantern", ["generat"], expect="did you mean generate"),
    C("analyses-unknown-command", "ambiguity.analyses", ["concentrate"], expect="unknown command"),
    C("amb-merge-no-run", "ambiguity", ["merge"], expect="run"),
    # ---------------------------------------------------------------- ambiguity.profile
    C("profile-image-size-not-llamagen", P, ["--image-size", "256"], expect="drop --image-size"),
    C("profile-weights-truncated", P, ["--num-images", "1", *EMB_W], TRUNC_GPT, "fashion_gpt.safetensors"),
    C("profile-weights-text-file", P, ["--num-images", "1", *EMB_W], TEXT_GPT, "fashion_gpt.safetensors"),
    C("profile-weights-empty-vq", P, ["--num-images", "1", *EMB_W], EMPTY_VQ, "fashion_vq.safetensors"),
    C("profile-weights-swapped", P, ["--num-images", "1", *EMB_W], SWAPPED, "which file goes where"),
    C("profile-weights-missing-dir", P, ["--weights", "{tmp}/nope"], expect="does not exist"),
    C(
        "profile-weights-nan",
        P,
        ["--num-images", "1", *EMB_W],
        embedded_weights(nan_in("fashion_gpt.safetensors", "output.weight")),
        "NaN",
    ),
    C(
        "profile-weights-inf-vq",
        P,
        ["--num-images", "1", *EMB_W],
        embedded_weights(nan_in("fashion_vq.safetensors", "quantize.embedding.weight", float("inf"))),
        "NaN",
    ),
    C(
        "profile-weights-of-embedded-16",
        P,
        ["--num-images", "1", *EMB_W],
        other_variant("fashion16", "fashion"),
        "--model embedded-16",
    ),
    C(
        "profile-16-weights-of-embedded",
        P,
        ["--model", "embedded-16", "--num-images", "1", *EMB_W],
        other_variant("fashion", "fashion16"),
        "--model embedded",
    ),
    C("profile-weights-is-file", P, ["--weights", AW / "fashion_gpt.safetensors"], expect="directory"),
    C(
        "profile-weights-dir-of-junk",
        P,
        ["--weights", "{tmp}/w"],
        embedded_weights(lambda d: [(d / f).unlink() for f in ("fashion_gpt.safetensors",)]),
        "fashion_gpt",
    ),
    C(
        "profile-llamagen-no-weights",
        P,
        ["--model", "llamagen-c2i-b", "--weights", "{tmp}/lg"],
        lambda tmp: (tmp / "lg").mkdir(),
        "c2i_B_256.pt",
    ),
    C(
        "profile-llamagen-truncated",
        P,
        ["--model", "llamagen-c2i-b", "--weights", "{tmp}/lg"],
        llamagen_pair(lambda p: truncated(LLAMAGEN / "gpt_tiny_c2i.pt", p)),
        "c2i_B_256.pt",
    ),
    C(
        "profile-llamagen-garbage",
        P,
        ["--model", "llamagen-c2i-b", "--weights", "{tmp}/lg/c2i_B_256.pt"],
        llamagen_pair(lambda p: write(p, "garbage")),
        "c2i_B_256.pt",
    ),
    C(
        "profile-llamagen-safetensors-as-pt",
        P,
        ["--model", "llamagen-c2i-b", "--weights", "{tmp}/lg/c2i_B_256.pt"],
        llamagen_pair(lambda p: shutil.copy(AW / "fashion_gpt.safetensors", p)),
        "c2i_B_256.pt",
    ),
    C(
        "profile-llamagen-t2i-ckpt",
        P,
        ["--model", "llamagen-c2i-b", "--weights", "{tmp}/lg/c2i_B_256.pt"],
        llamagen_pair(lambda p: shutil.copy(LLAMAGEN / "gpt_tiny_t2i.pt", p)),
        "does not match",
    ),
    C(
        "profile-llamagen-dir-as-weights",
        P,
        ["--model", "llamagen-c2i-b", "--weights", "{tmp}/lg/c2i_B_256.pt"],
        llamagen_pair(lambda p: p.mkdir()),
        "c2i_B_256.pt",
    ),
    C("profile-data-garbage-gz", P, ["--source", "dataset", "--data", "{tmp}/fm"], idx_dir("garbage-gz"), "t10k"),
    C("profile-data-truncated-gz", P, ["--source", "dataset", "--data", "{tmp}/fm"], idx_dir("truncated-gz"), "t10k"),
    C(
        "profile-data-truncated-raw",
        P,
        ["--source", "dataset", "--data", "{tmp}/fm"],
        idx_dir("truncated-raw"),
        "truncated",
    ),
    C("profile-data-bad-magic", P, ["--source", "dataset", "--data", "{tmp}/fm"], idx_dir("bad-magic"), "IDX"),
    C("profile-data-empty-files", P, ["--source", "dataset", "--data", "{tmp}/fm"], idx_dir("empty"), "IDX"),
    C("profile-data-header-only", P, ["--source", "dataset", "--data", "{tmp}/fm"], idx_dir("header-only"), "IDX"),
    C("profile-data-huge-dims", P, ["--source", "dataset", "--data", "{tmp}/fm"], idx_dir("huge-dims"), "t10k"),
    C(
        "profile-data-count-mismatch",
        P,
        ["--source", "dataset", "--data", "{tmp}/fm"],
        idx_dir("mismatch"),
        "do not match",
    ),
    C("profile-data-text-files", P, ["--source", "dataset", "--data", "{tmp}/fm"], idx_dir("text"), "IDX"),
    C("profile-data-missing", P, ["--source", "dataset", "--data", "{tmp}/nope"], expect="--data"),
    C("profile-data-is-file", P, ["--source", "dataset", "--data", ROOT / "README.md"], expect="--data"),
    C("profile-data-without-dataset", P, ["--data", "{tmp}"], expect="--source dataset"),
    C(
        "profile-images-empty-dir",
        P,
        ["--source", "dataset", "--images", "{tmp}/imgs"],
        lambda tmp: (tmp / "imgs").mkdir(),
        "--images",
    ),
    C("profile-captions-to-c2i", P, ["--num-images", "1", "--captions", "{tmp}/caps.txt"], CAPS, "class-conditional"),
    C(
        "profile-captions-to-c2i-dataset",
        P,
        ["--source", "dataset", "--captions", "{tmp}/caps.txt"],
        CAPS,
        "class-conditional",
    ),
    C("profile-captions-empty", P, ["--captions", "{tmp}/caps.txt"], captions("\n\n"), "no captions"),
    C("profile-captions-binary", P, ["--captions", "{tmp}/caps.txt"], captions(b"\xff\xfe\x00\x81"), "UTF-8"),
    C("profile-captions-bad-json", P, ["--captions", "{tmp}/c.json"], captions('{"annotations": [', "c.json"), "JSON"),
    C("profile-captions-dir", P, ["--captions", "{tmp}"], expect="directory"),
    C("profile-captions-missing", P, ["--captions", "{tmp}/none.txt"], expect="does not exist"),
    C("profile-cfg-inf", P, ["--cfg", "inf"], expect="--cfg"),
    C("profile-cfg-nan", P, ["--cfg", "nan"], expect="--cfg"),
    C("profile-cfg-huge", P, ["--num-images", "1", "--cfg", "1e38"], expect="--cfg"),
    C("profile-cfg-negative", P, ["--cfg", "-1"], expect="--cfg"),
    C("profile-temperature-negative", P, ["--temperature", "-0.5"], expect="--temperature"),
    C("profile-temperature-tiny", P, ["--num-images", "1", "--temperature", "1e-42"], expect="--temperature"),
    C("profile-top-p-zero", P, ["--top-p", "0"], expect="--top-p"),
    C("profile-top-p-two", P, ["--top-p", "2"], expect="--top-p"),
    C("profile-top-k-negative", P, ["--top-k", "-3"], expect="--top-k"),
    C("profile-seed-64bit", P, ["--seed", BIG_SEED], expect="--seed"),
    C("profile-seed-text", P, ["--seed", "abc"], expect="--seed"),
    C("profile-num-images-zero", P, ["--num-images", "0"], expect="--num-images"),
    C("profile-num-images-huge", P, ["--num-images", HUGE], expect="--num-images"),
    C("profile-num-images-float", P, ["--num-images", "2.5"], expect="--num-images"),
    C("profile-batch-size-zero", P, ["--batch-size", "0"], expect="--batch-size"),
    C("profile-batch-size-huge", P, ["--num-images", "200000", "--batch-size", "200000"], expect="--batch-size"),
    C("profile-classes-out-of-range", P, ["--classes", "10"], expect="0..9"),
    C("profile-classes-negative", P, ["--classes", "-1"], expect="class"),
    C("profile-classes-text", P, ["--classes", "shoe,bag"], expect="--classes"),
    C("profile-classes-empty", P, ["--classes", ","], expect="--classes"),
    C("profile-device-bogus", P, ["--device", "bogus"], expect="--device must be auto, cpu, cuda or cuda:N"),
    C("profile-device-cuda-absent", P, ["--device", NO_GPU], expect="cuda"),
    C("profile-device-mps", P, ["--device", "mps"], expect="--device"),
    C("profile-dtype-bogus", P, ["--dtype", "int8"], expect="--dtype"),
    C("profile-source-bogus", P, ["--source", "web"], expect="--source"),
    C("profile-model-bogus", P, ["--model", "llamagen"], expect="unknown model"),
    C("profile-model-hf-absent", P, ["--model", "hf:nobody/nothing-here"], expect="nobody/nothing-here"),
    C("profile-out-below-file", P, ["--out", "{tmp}/file/sub"], below_file, "lies below the file"),
    C("profile-out-is-file", P, ["--out", "{tmp}/file"], below_file, "is a file"),
    C("profile-out-unwritable", P, ["--out", "/proc/version/out"], expect="--out"),
    C(
        "profile-out-other-settings",
        P,
        ["--num-images", "1", "--seed", "1"],
        files(**{"out/run.json": json.dumps({"command": "x", "settings": {"settings": {"seed": 0}}})}),
        "other settings",
    ),
    C("profile-out-damaged-run-json", P, ["--num-images", "1"], files(**{"out/run.json": "{broken"}), "damaged"),
    C("profile-shard-index-out-of-range", P, ["--shard-index", "2", "--num-shards", "2"], expect="--shard-index"),
    C("profile-shard-index-alone", P, ["--shard-index", "0"], expect="--num-shards"),
    C(
        "profile-text-twin-classes",
        P,
        ["--model", "text-twin", "--classes", "3", "--num-images", "1"],
        expect="--classes",
    ),
    C("profile-unknown-option", P, ["--num-image", "3", "--bogus"], expect="unrecognized"),
    C("profile-out-empty-string", P, ["--out", ""], expect="--out"),
    C("profile-out-name-too-long", P, ["--out", "{tmp}/" + "x" * 300], expect="--out"),
    C("profile-model-empty-string", P, ["--model", ""], expect="unknown model"),
    C("profile-weights-empty-string", P, ["--weights", ""], expect="--weights"),
    C("profile-seed-float-syntax", P, ["--seed", "1e3"], expect="--seed"),
    C("profile-num-images-negative", P, ["--num-images", "-5"], expect="--num-images"),
    C(
        "profile-images-garbage",
        P,
        ["--source", "dataset", "--images", "{tmp}/imgs", "--num-images", "1"],
        files(**{"imgs/a.png": "not an image"}),
        "a.png",
    ),
    C(
        "profile-coco-without-captions",
        P,
        ["--captions", "{tmp}/c.json"],
        captions(json.dumps({"annotations": [{"image_id": 1}]}), "c.json"),
        "caption",
    ),
    C("profile-hf-dir-not-a-model", P, ["--model", "hf:{tmp}/empty"], lambda tmp: (tmp / "empty").mkdir(), "empty"),
    C(
        "profile-text-twin-dataset-too-many",
        P,
        ["--model", "text-twin", "--source", "dataset", "--num-images", "100000"],
        expect="--num-images",
    ),
    C("profile-device-cuda-dtype", P, ["--device", NO_GPU, "--dtype", "bf16"], expect="cuda"),
    # ---------------------------------------------------------------- ambiguity.neighbourhood
    C("nb-k-zero", N, ["--k", "0"], expect="--k"),
    C("nb-k-negative", N, ["--k", "-4"], expect="--k"),
    C("nb-k-too-large", N, ["--k", "1024"], expect="--k"),
    C("nb-k-text", N, ["--k", "many"], expect="--k"),
    C("nb-k-huge", N, ["--k", HUGE], expect="--k"),
    C("nb-metric-bogus", N, ["--metric", "manhattan"], expect="--metric"),
    C("nb-matrix-bogus", N, ["--matrix", "pixels"], expect="--matrix"),
    C("nb-seed-negative", N, ["--seed", "-1"], expect="--seed"),
    C("nb-out-suffix", N, ["--k", "4", "--out", "{tmp}/nb.txt"], expect=".parquet"),
    C("nb-out-below-file", N, ["--k", "4", "--out", "{tmp}/file/nb.parquet"], below_file, "below the file"),
    C("nb-out-is-dir", N, ["--k", "4", "--out", "{tmp}"], expect="--out"),
    C("nb-cache-below-file", N, ["--k", "4", "--cache-dir", "{tmp}/file/c"], below_file, "--cache-dir"),
    C("nb-weights-truncated", N, ["--k", "4", *EMB_W], TRUNC_GPT, "fashion_gpt.safetensors"),
    C("nb-device-bogus", N, ["--device", "gpu0"], expect="--device"),
    C("nb-model-bogus", N, ["--model", "nope"], expect="unknown model"),
    C("nb-text-twin-codebook", N, ["--model", "text-twin", "--k", "4"], expect="codebook"),
    C("nb-out-name-too-long", N, ["--k", "4", "--out", "{tmp}/" + "y" * 300 + ".parquet"], expect="--out"),
    # ---------------------------------------------------------------- ambiguity.analyses concentration
    C("conc-ks-text", CO, ["--ks", "a,b"], expect="--ks"),
    C("conc-ks-empty", CO, ["--ks", ","], expect="--ks"),
    C("conc-ks-zero", CO, ["--ks", "0,4"], expect="--ks"),
    C("conc-ks-too-large", CO, ["--ks", "4,5000", "--num-images", "1"], expect="--ks"),
    C("conc-metrics-bogus", CO, ["--metrics", "l2,manhattan"], expect="--metrics"),
    C("conc-metrics-empty", CO, ["--metrics", ","], expect="--metrics"),
    C("conc-anchor-bogus", CO, ["--anchor", "best"], expect="--anchor"),
    C("conc-num-images-zero", CO, ["--num-images", "0"], expect="--num-images"),
    C("conc-num-images-huge", CO, ["--num-images", HUGE], expect="--num-images"),
    C("conc-batch-size-zero", CO, ["--batch-size", "0"], expect="--batch-size"),
    C("conc-cfg-inf", CO, ["--cfg", "inf"], expect="--cfg"),
    C("conc-data-garbage", CO, ["--data", "{tmp}/fm", "--num-images", "2"], idx_dir("garbage-gz"), "t10k"),
    C("conc-data-missing", CO, ["--data", "{tmp}/nope", "--num-images", "2"], expect="--data"),
    C("conc-weights-swapped", CO, [*EMB_W, "--num-images", "1"], SWAPPED, "which file goes where"),
    C(
        "conc-weights-nan",
        CO,
        [*EMB_W, "--num-images", "1"],
        embedded_weights(nan_in("fashion_gpt.safetensors", "output.weight")),
        "NaN",
    ),
    C("conc-captions-to-c2i", CO, ["--captions", "{tmp}/caps.txt", "--num-images", "1"], CAPS, "class-conditional"),
    C("conc-out-below-file", CO, ["--out", "{tmp}/file/o"], below_file, "below the file"),
    C("conc-cache-below-file", CO, ["--cache-dir", "{tmp}/file/c", "--num-images", "1"], below_file, "--cache-dir"),
    C("conc-device-bogus", CO, ["--device", "tpu"], expect="--device"),
    C("conc-seed-64bit", CO, ["--seed", BIG_SEED], expect="--seed"),
    C("conc-text-twin-codebook", CO, ["--model", "text-twin", "--num-images", "1"], expect="codebook"),
    # ---------------------------------------------------------------- ambiguity.analyses interchangeability
    C("inter-rates-nan", IN, ["--rates", "nan"], expect="--rates"),
    C("inter-rates-above-one", IN, ["--rates", "0.5,2"], expect="--rates"),
    C("inter-rates-empty", IN, ["--rates", ""], expect="--rates"),
    C("inter-ks-text", IN, ["--ks", "x"], expect="--ks"),
    C("inter-ks-too-large", IN, ["--ks", "2048", "--num-images", "1"], expect="--ks"),
    C("inter-show-zero", IN, ["--show", "0"], expect="--show"),
    C("inter-repeats-zero", IN, ["--repeats", "0"], expect="--repeats"),
    C("inter-repeats-huge", IN, ["--repeats", HUGE], expect="--repeats"),
    C("inter-grid-k-missing", IN, ["--ks", "1,4", "--grid-k", "16"], expect="--grid-k"),
    C("inter-metric-bogus", IN, ["--metric", "random"], expect="--metric"),
    C("inter-num-images-zero", IN, ["--num-images", "0"], expect="--num-images"),
    C("inter-data-truncated", IN, ["--data", "{tmp}/fm", "--num-images", "2"], idx_dir("truncated-gz"), "t10k"),
    C("inter-out-below-file", IN, ["--out", "{tmp}/file/o"], below_file, "below the file"),
    C("inter-weights-truncated", IN, [*EMB_W, "--num-images", "1"], TRUNC_GPT, "fashion_gpt.safetensors"),
    C("inter-text-twin-cannot-decode", IN, ["--model", "text-twin", "--num-images", "1"], expect="decode"),
    # ---------------------------------------------------------------- ambiguity.compare / lantern.drafter.comparison
    C("acompare-models-empty", "ambiguity.compare", ["--models", ","], expect="--models"),
    C("acompare-models-bogus", "ambiguity.compare", ["--models", "embedded,nope"], expect="unknown model"),
    C("acompare-weights-no-equals", "ambiguity.compare", ["--weights", "embedded"], expect="MODEL=PATH"),
    C("acompare-weights-other-model", "ambiguity.compare", ["--weights", "anole={tmp}"], expect="--models"),
    C("acompare-weights-missing", "ambiguity.compare", ["--weights", "embedded={tmp}/nope"], expect="does not exist"),
    C(
        "acompare-weights-truncated",
        "ambiguity.compare",
        ["--models", "embedded", "--num-images", "2", "--weights", "embedded={tmp}/w"],
        TRUNC_GPT,
        "fashion_gpt.safetensors",
    ),
    C(
        "acompare-accuracy-garbage",
        "ambiguity.compare",
        [
            "--models",
            "embedded",
            "--num-images",
            "2",
            "--bootstrap",
            "10",
            "--drafter-accuracy",
            "embedded={tmp}/acc.parquet",
        ],
        files(acc__parquet="PAR1 not really"),
        "acc.parquet",
    ),
    C("acompare-bootstrap-negative", "ambiguity.compare", ["--bootstrap", "-1"], expect="--bootstrap"),
    C("acompare-level-above-one", "ambiguity.compare", ["--level", "1.5"], expect="--level"),
    C("acompare-level-nan", "ambiguity.compare", ["--level", "nan"], expect="--level"),
    C("acompare-num-images-zero", "ambiguity.compare", ["--num-images", "0"], expect="--num-images"),
    C("acompare-batch-size-zero", "ambiguity.compare", ["--batch-size", "0"], expect="--batch-size"),
    C("acompare-figures-below-file", "ambiguity.compare", ["--figures", "{tmp}/file/f"], below_file, "--figures"),
    C(
        "acompare-data-garbage",
        "ambiguity.compare",
        ["--models", "embedded", "--source", "dataset", "--data", "{tmp}/fm", "--num-images", "2"],
        idx_dir("garbage-gz"),
        "t10k",
    ),
    C("acompare-seed-64bit", "ambiguity.compare", ["--seed", BIG_SEED], expect="--seed"),
    C(
        "acompare-accuracy-dir",
        "ambiguity.compare",
        ["--models", "embedded", "--num-images", "2", "--bootstrap", "10", "--drafter-accuracy", "embedded={tmp}"],
        expect="accuracy",
    ),
    C(
        "acompare-bootstrap-huge",
        "ambiguity.compare",
        ["--models", "embedded", "--num-images", "2", "--bootstrap", HUGE],
        expect="--bootstrap",
    ),
    C("lcompare-models-bogus", "lantern.drafter.comparison", ["--models", "emb"], expect="unknown model"),
    C("lcompare-out-below-file", "lantern.drafter.comparison", ["--out", "{tmp}/file/x"], below_file, "below the file"),
    C("lcompare-cfg-inf", "lantern.drafter.comparison", ["--cfg", "inf"], expect="--cfg"),
    C("lcompare-device-bogus", "lantern.drafter.comparison", ["--device", "cpu0"], expect="--device"),
    # ---------------------------------------------------------------- python -m ambiguity merge
    C("merge-missing-dir", "ambiguity merge", ["{tmp}/nope"], expect="run"),
    C("merge-not-a-run", "ambiguity merge", ["{tmp}"], expect="run.json"),
    C("merge-damaged-run-json", "ambiguity merge", ["{tmp}"], files(run__json="{not json"), "damaged"),
    C(
        "merge-foreign-merge-function",
        "ambiguity merge",
        ["{tmp}"],
        files(run__json=json.dumps({"command": "x", "settings": {}, "merge": "os:system"})),
        "merge",
    ),
    C("merge-missing-shard", "ambiguity merge", ["{tmp}/run", "--no-figures"], prof_shard_run, "batch_00001"),
    C(
        "merge-run-json-without-key",
        "ambiguity merge",
        ["{tmp}/run", "--no-figures"],
        both(prof_shard_run, lambda tmp: edit_json("run.json", lambda r: r["settings"].pop("key"))(tmp / "run")),
        "run.json",
    ),
    C(
        "merge-damaged-part",
        "ambiguity merge",
        ["{tmp}/run", "--no-figures"],
        both(
            prof_shard_run,
            lambda tmp: truncated(
                tmp / "run/parts/batch_00000.tokens.parquet", tmp / "run/parts/batch_00000.tokens.parquet"
            ),
        ),
        "batch_00000",
    ),
    C("merge-file", "ambiguity merge", [ROOT / "README.md"], expect="run"),
    # ---------------------------------------------------------------- lantern.generate
    C("gen-method-bogus", G, ["--method", "eagle"], expect="--method"),
    C("gen-gamma-zero", G, ["--gamma", "0"], expect="--gamma"),
    C("gen-gamma-huge", G, ["--gamma", "1000000000", "--num-images", "1"], expect="--gamma"),
    C("gen-k-too-large", G, ["--k", "1024", "--num-images", "1"], expect="--k"),
    C("gen-k-negative", G, ["--k", "-1"], expect="--k"),
    C("gen-image-size-not-llamagen", G, ["--image-size", "256"], expect="drop --image-size"),
    C("gen-delta-negative", G, ["--delta", "-0.1"], expect="--delta"),
    C("gen-delta-above-one", G, ["--delta", "1.5"], expect="--delta"),
    C("gen-delta-nan", G, ["--delta", "nan"], expect="--delta"),
    C("gen-lam-below-one", G, ["--method", "lantern++", "--lam", "0.5"], expect="--lam"),
    C("gen-tree-bogus", G, ["--tree", "bushy"], expect="--tree"),
    C("gen-tree-with-sjd", G, ["--method", "sjd", "--tree", "dynamic"], expect="--tree does not apply to --method sjd"),
    C("gen-window-with-ar", G, ["--method", "ar", "--window", "4"], expect="--window does not apply to --method ar"),
    C(
        "gen-entropy-min-window-zero",
        G,
        ["--method", "entropy-sd", "--entropy-min-window", "0"],
        expect="--entropy-min-window",
    ),
    C(
        "gen-entropy-window-scale-zero",
        G,
        ["--method", "entropy-sd", "--entropy-window-scale", "0"],
        expect="--entropy-window-scale",
    ),
    C(
        "gen-entropy-window-scale-nan",
        G,
        ["--method", "entropy-sd", "--entropy-window-scale", "nan"],
        expect="--entropy-window-scale",
    ),
    C(
        "gen-entropy-min-window-with-sjd",
        G,
        ["--method", "sjd", "--entropy-min-window", "4"],
        expect="--entropy-min-window does not apply to --method sjd",
    ),
    C("gen-tree-json-garbage", G, ["--tree", "{tmp}/t.json"], files(t__json="[[0], [0, 1"), "t.json"),
    C("gen-tree-json-bad-paths", G, ["--tree", "{tmp}/t.json"], files(t__json='[[0], [3, -1], "x"]'), "t.json"),
    C("gen-tree-json-missing", G, ["--tree", "{tmp}/none.json"], expect="none.json does not exist"),
    C("gen-tree-path-missing", G, ["--tree", "{tmp}/trees/t"], expect="trees/t does not exist"),
    C("gen-tree-json-empty-list", G, ["--tree", "{tmp}/t.json"], files(t__json="[]"), "t.json"),
    C("gen-total-tokens-zero", G, ["--tree", "dynamic", "--total-tokens", "0"], expect="--total-tokens"),
    C("gen-depth-huge", G, ["--tree", "dynamic", "--depth", "1000000", "--num-images", "1"], expect="--depth"),
    C(
        "gen-tree-top-k-huge",
        G,
        ["--tree", "dynamic", "--tree-top-k", HUGE, "--num-images", "1"],
        expect="--tree-top-k",
    ),
    C(
        "gen-total-tokens-huge",
        G,
        ["--tree", "dynamic", "--total-tokens", HUGE, "--num-images", "1"],
        expect="--total-tokens",
    ),
    C(
        "gen-drafter-truncated",
        G,
        ["--num-images", "1", "--drafter", "{tmp}/d.safetensors"],
        TRUNC_DRAFTER,
        "d.safetensors",
    ),
    C(
        "gen-drafter-text",
        G,
        ["--num-images", "1", "--drafter", "{tmp}/d.safetensors"],
        files(d__safetensors="hello"),
        "d.safetensors",
    ),
    C(
        "gen-drafter-other-model",
        G,
        ["--num-images", "1", "--drafter", LW / "text-twin_drafter.safetensors"],
        expect="text-twin",
    ),
    C(
        "gen-drafter-is-model-weights",
        G,
        ["--num-images", "1", "--drafter", AW / "fashion_gpt.safetensors"],
        expect="drafter",
    ),
    C("gen-drafter-all-nan", G, ["--num-images", "1", "--drafter", "{tmp}/d.safetensors"], nan_drafter, "NaN"),
    C("gen-drafter-dir", G, ["--num-images", "1", "--drafter", "{tmp}"], expect="drafter"),
    C("gen-drafter-missing", G, ["--num-images", "1", "--drafter", "{tmp}/nope.safetensors"], expect="does not exist"),
    C("gen-weights-swapped", G, ["--num-images", "1", *EMB_W], SWAPPED, "which file goes where"),
    C(
        "gen-weights-truncated-vq",
        G,
        ["--num-images", "1", *EMB_W],
        embedded_weights(lambda d: truncated(d / "fashion_vq.safetensors", d / "fashion_vq.safetensors", 0.9)),
        "fashion_vq.safetensors",
    ),
    C("gen-num-images-huge", G, ["--num-images", HUGE], expect="--num-images"),
    C("gen-num-images-zero", G, ["--num-images", "0"], expect="--num-images"),
    C("gen-text-twin-lantern-codebook", G, ["--model", "text-twin", "--num-images", "1"], expect="codebook"),
    C(
        "gen-classes-for-text-model",
        G,
        ["--model", "text-twin", "--classes", "3", "--num-images", "1", "--method", "ar"],
        expect="--classes",
    ),
    C("gen-device-cuda-index", G, ["--device", NO_GPU, "--num-images", "1"], expect="cuda"),
    C("gen-seed-64bit", G, ["--seed", BIG_SEED], expect="--seed"),
    C("gen-cfg-inf", G, ["--cfg", "inf"], expect="--cfg"),
    C("gen-cfg-huge", G, ["--cfg", "1e300", "--num-images", "1"], expect="--cfg"),
    C("gen-temperature-nan", G, ["--temperature", "nan"], expect="--temperature"),
    C("gen-captions-to-c2i", G, ["--captions", "{tmp}/caps.txt", "--num-images", "1"], CAPS, "class-conditional"),
    C("gen-classes-out-of-range", G, ["--classes", "3,12"], expect="0..9"),
    C("gen-device-bogus", G, ["--device", "bogus"], expect="--device must be auto, cpu, cuda or cuda:N"),
    C("gen-device-cuda", G, ["--device", NO_GPU, "--method", "ar"], expect="cuda"),
    C("gen-out-below-file", G, ["--out", "{tmp}/file/run"], below_file, "below the file"),
    C("gen-out-is-file", G, ["--out", "{tmp}/file"], below_file, "is a file"),
    C("gen-num-shards-zero", G, ["--num-shards", "0"], expect="--num-shards"),
    C("gen-shard-index-too-big", G, ["--shard-index", "5", "--num-shards", "2"], expect="--shard-index"),
    C("gen-convention-bogus", G, ["--convention", "loose"], expect="--convention"),
    C("gen-metric-bogus", G, ["--metric", "hamming"], expect="--metric"),
    C(
        "gen-text-twin-lantern-captions",
        G,
        ["--model", "text-twin", "--num-images", "1", "--captions", "{tmp}/caps.txt"],
        CAPS,
        "text-twin",
    ),
    C(
        "gen-llamagen-garbage",
        G,
        ["--model", "llamagen-c2i-b", "--weights", "{tmp}/lg/c2i_B_256.pt", "--method", "ar"],
        llamagen_pair(lambda p: write(p, b"\x80\x02garbage")),
        "c2i_B_256.pt",
    ),
    # ---------------------------------------------------------------- lantern.replay
    C("replay-missing-run", R, ["{tmp}/nope"], expect="does not exist"),
    C("replay-file-as-run", R, [ROOT / "README.md"], expect="README.md"),
    C("replay-empty-dir", R, ["{tmp}"], expect="summary.json"),
    C("replay-truncated-drafts", R, ["{tmp}/run"], gen_run(truncate_file("drafts.parquet")), "drafts.parquet"),
    C("replay-truncated-images", R, ["{tmp}/run"], gen_run(truncate_file("images.parquet")), "images.parquet"),
    C("replay-broken-summary", R, ["{tmp}/run"], gen_run(replace_file("summary.json", '{"method": ')), "summary.json"),
    C("replay-summary-list", R, ["{tmp}/run"], gen_run(replace_file("summary.json", "[1, 2]")), "summary.json"),
    C("replay-missing-steps", R, ["{tmp}/run"], gen_run(remove_file("steps.parquet")), "steps.parquet"),
    C(
        "replay-drafts-wrong-table",
        R,
        ["{tmp}/run"],
        gen_run(lambda d: shutil.copy(d / "steps.parquet", d / "drafts.parquet")),
        "drafts.parquet",
    ),
    C(
        "replay-missing-png",
        R,
        ["{tmp}/run", "--reference", "{tmp}/ref"],
        both(gen_run(), gen_run(remove_file("images/00001.png"), "ref")),
        "00001.png",
    ),
    C("replay-reference-missing", R, ["{tmp}/run", "--reference", "{tmp}/nope"], gen_run(), "nope"),
    C(
        "replay-reference-other-seed",
        R,
        ["{tmp}/run", "--reference", "{tmp}/ref"],
        both(gen_run(), gen_run(lambda d: _set_image_column(d, "seed", 7), "ref")),
        "--seed",
    ),
    C("replay-profile-run", R, ["{tmp}/run"], prof_shard_run, "lantern.generate"),
    C("replay-bins-zero", R, ["{tmp}/run", "--bins", "0"], expect="--bins"),
    C("replay-bins-1e9", R, ["{tmp}/run", "--bins", "1e9"], expect="--bins"),
    C("replay-bins-too-many", R, ["{tmp}/run", "--bins", "1000000000"], gen_run(), "--bins"),
    C(
        "replay-figure-below-file",
        R,
        ["{tmp}/run", "--figure", "{tmp}/file/fig"],
        both(gen_run(), below_file),
        "below the file",
    ),
    C(
        "replay-out-below-file",
        R,
        ["{tmp}/run", "--out", "{tmp}/file/o"],
        both(gen_run(), below_file),
        "below the file",
    ),
    C("replay-extractors-bogus", R, ["{tmp}/run", "--quality", "--extractors", "vgg"], gen_run(), "vgg"),
    C(
        "replay-quality-reference-bogus",
        R,
        ["{tmp}/run", "--quality", "--extractors", "fmnist", "--quality-reference", "fashion-mnist:validation"],
        gen_run(),
        "fashion-mnist",
    ),
    C(
        "replay-quality-weights-garbage",
        R,
        ["{tmp}/run", "--quality", "--extractors", "fmnist", "--weights", "fmnist={tmp}/f.safetensors"],
        both(gen_run(), files(f__safetensors="nope")),
        "f.safetensors",
    ),
    C("replay-scores-device-bogus", R, ["{tmp}/run", "--scores", "--device", "bogus"], gen_run(), "--device"),
    C(
        "replay-reference-of-embedded-16",
        R,
        ["{tmp}/run16", "--reference", "{tmp}/run"],
        both(gen_run(), gen16_run),
        "256 tokens per image but the reference",
    ),
    C("replay-bootstrap-negative", R, ["{tmp}/run", "--bootstrap", "-5"], expect="--bootstrap"),
    C("replay-run-named-twice", R, ["{tmp}/run", "{tmp}/run/"], gen_run(), "named twice"),
    # ---------------------------------------------------------------- lantern.evaluate
    C("eval-missing-run", E, ["{tmp}/nope", "--extractors", "fmnist"], expect="nope"),
    C("eval-spec-bogus", E, ["fashion-mnist:validation", "--extractors", "fmnist"], expect="fashion-mnist"),
    C("eval-spec-count-zero", E, ["fashion-mnist:test@0", "--extractors", "fmnist"], expect="@"),
    C("eval-spec-count-text", E, ["fashion-mnist:test@many", "--extractors", "fmnist"], expect="@"),
    C("eval-empty-folder", E, ["{tmp}/imgs", "--extractors", "fmnist"], lambda tmp: (tmp / "imgs").mkdir(), "imgs"),
    C(
        "eval-garbage-png",
        E,
        ["{tmp}/imgs", "--extractors", "fmnist"],
        files(**{"imgs/a.png": "not a png", "imgs/b.png": "also not"}),
        "a.png",
    ),
    C(
        "eval-truncated-images-table",
        E,
        ["{tmp}/run", "--extractors", "fmnist"],
        gen_run(truncate_file("images.parquet")),
        "images.parquet",
    ),
    C(
        "eval-broken-summary",
        E,
        ["{tmp}/run", "--extractors", "fmnist"],
        gen_run(replace_file("summary.json", "nope")),
        "summary.json",
    ),
    C(
        "eval-truncated-png",
        E,
        ["{tmp}/run", "--extractors", "fmnist", "--reference", "fashion-mnist:test@20", "--bootstrap", "0"],
        gen_run(truncate_file("images/00000.png")),
        "00000.png",
    ),
    C("eval-extractors-bogus", E, ["fashion-mnist:test@10", "--extractors", "vgg16"], expect="vgg16"),
    C("eval-extractors-empty", E, ["fashion-mnist:test@10", "--extractors", ","], expect="--extractors"),
    C(
        "eval-weights-truncated",
        E,
        [
            "fashion-mnist:test@10",
            "--extractors",
            "fmnist",
            "--reference",
            "fashion-mnist:train@10",
            "--weights",
            "fmnist={tmp}/c.safetensors",
        ],
        lambda tmp: truncated(LW / "fmnist_classifier.safetensors", tmp / "c.safetensors"),
        "c.safetensors",
    ),
    C(
        "eval-weights-wrong-model",
        E,
        [
            "fashion-mnist:test@10",
            "--extractors",
            "fmnist",
            "--reference",
            "fashion-mnist:train@10",
            "--weights",
            f"fmnist={LW / 'embedded_drafter.safetensors'}",
        ],
        expect="fmnist",
    ),
    C(
        "eval-weights-mobilenet-garbage",
        E,
        [
            "fashion-mnist:test@10",
            "--extractors",
            "mobilenet",
            "--reference",
            "fashion-mnist:train@10",
            "--weights",
            "mobilenet={tmp}/m.pth",
        ],
        files(m__pth="garbage"),
        "m.pth",
    ),
    C("eval-weights-unknown-name", E, ["fashion-mnist:test@10", "--weights", "vgg={tmp}"], expect="vgg"),
    C("eval-bootstrap-negative", E, ["fashion-mnist:test@10", "--bootstrap", "-1"], expect="--bootstrap"),
    C("eval-bootstrap-huge", E, ["fashion-mnist:test@10", "--bootstrap", HUGE], expect="--bootstrap"),
    C("eval-level-two", E, ["fashion-mnist:test@10", "--level", "2"], expect="--level"),
    C("eval-level-one", E, ["fashion-mnist:test@10", "--level", "1"], expect="--level"),
    C("eval-run-named-twice", E, ["{tmp}/run", "{tmp}/run/", "--extractors", "fmnist"], gen_run(), "named twice"),
    C(
        "eval-paired-with-only-run",
        E,
        ["{tmp}/run", "--paired-with", "{tmp}/run", "--extractors", "fmnist"],
        gen_run(),
        "only run",
    ),
    C("eval-one-image-run", E, ["{tmp}/run16", "--extractors", "fmnist"], gen16_run, "need at least 2 per set"),
    C("eval-one-image-spec", E, ["fashion-mnist:test@1", "--extractors", "fmnist"], expect="need at least 2 per set"),
    C("eval-k-zero", E, ["fashion-mnist:test@10", "--nearest-k", "0"], expect="--nearest-k"),
    C(
        "eval-k-huge",
        E,
        [
            "fashion-mnist:test@10",
            "--extractors",
            "fmnist",
            "--reference",
            "fashion-mnist:train@10",
            "--nearest-k",
            "1000",
        ],
        expect="--nearest-k",
    ),
    C("eval-batch-size-zero", E, ["fashion-mnist:test@10", "--batch-size", "0"], expect="--batch-size"),
    C("eval-seed-64bit", E, ["fashion-mnist:test@10", "--seed", BIG_SEED], expect="--seed"),
    C("eval-device-bogus", E, ["fashion-mnist:test@10", "--device", "bogus"], expect="--device"),
    C("eval-out-below-file", E, ["fashion-mnist:test@10", "--out", "{tmp}/file/o"], below_file, "below the file"),
    C("eval-figure-below-file", E, ["fashion-mnist:test@10", "--figure", "{tmp}/file/f"], below_file, "below the file"),
    C("eval-cache-below-file", E, ["fashion-mnist:test@10", "--cache", "{tmp}/file/c"], below_file, "--cache"),
    C(
        "eval-class-names-empty",
        E,
        ["{tmp}/run", "--clip-score", "--class-names", "{tmp}/names.txt"],
        both(gen_run(), files(names__txt="")),
        "names.txt",
    ),
    C("eval-clip-absent", E, ["{tmp}/run", "--clip-score", "--clip-model", "{tmp}/noclip"], gen_run(), "clip"),
    C(
        "eval-proxy-reference-missing",
        E,
        ["{tmp}/run", "--extractors", "fmnist", "--proxy-reference", "{tmp}/nope"],
        gen_run(),
        "nope",
    ),
    C(
        "eval-data-garbage",
        E,
        ["fashion-mnist:test@10", "--extractors", "fmnist", "--data", "{tmp}/fm"],
        idx_dir("garbage-gz"),
        "t10k",
    ),
    C("eval-clip-scale-bogus", E, ["fashion-mnist:test@10", "--clip-scale", "x1000"], expect="--clip-scale"),
    C(
        "eval-reference-truncated-table",
        E,
        ["fashion-mnist:test@10", "--extractors", "fmnist", "--reference", "{tmp}/run"],
        gen_run(truncate_file("drafts.parquet")),
        "drafts.parquet",
    ),
    C(
        "eval-folder-mixed-sizes",
        E,
        ["{tmp}/imgs", "--extractors", "fmnist", "--reference", "fashion-mnist:test@10"],
        lambda tmp: _pngs(tmp / "imgs", [(32, 32), (40, 40)]),
        "size",
    ),
    C("eval-device-cuda", E, ["fashion-mnist:test@10", "--extractors", "fmnist", "--device", NO_GPU], expect="cuda"),
    # ---------------------------------------------------------------- lantern.drafter.train
    C("td-out-below-file", T, ["--out", "{tmp}/file/d.safetensors"], below_file, "below the file"),
    C("td-out-is-dir", T, ["--out", "{tmp}"], expect="--out"),
    C("td-run-dir-below-file", T, ["--run-dir", "{tmp}/file/r"], below_file, "below the file"),
    C("td-figure-below-file", T, ["--figure", "{tmp}/file/f.png"], below_file, "below the file"),
    C("td-batch-size-zero", T, ["--batch-size", "0"], expect="--batch-size"),
    C("td-gen-batch-size-zero", T, ["--self-generate", "4", "--gen-batch-size", "0"], expect="--gen-batch-size"),
    C("td-train-size-zero", T, ["--train-size", "0"], expect="--train-size"),
    C("td-test-size-zero", T, ["--test-size", "0"], expect="--test-size"),
    C("td-train-size-huge", T, ["--train-size", "100000000000"], expect="--train-size"),
    C("td-test-size-huge", T, ["--test-size", HUGE], expect="--test-size"),
    C("td-classes-out-of-range", T, ["--classes", "3,12"], expect="--classes"),
    C("td-classes-not-numbers", T, ["--classes", "shirt"], expect="--classes"),
    C(
        "td-classes-and-conditions",
        T,
        ["--self-generate", "4", "--classes", "1", "--conditions", "{tmp}/c.txt"],
        files(c__txt="1\n2\n"),
        "not both",
    ),
    C("td-epochs-negative", T, ["--epochs", "-1"], expect="--epochs"),
    C("td-lr-zero", T, ["--lr", "0"], expect="--lr"),
    C("td-lr-nan", T, ["--lr", "nan"], expect="--lr"),
    C("td-lr-huge", T, ["--lr", "1e30"], expect="--lr"),
    C("td-uncond-fraction", T, ["--uncond-fraction", "0.7"], expect="--uncond-fraction"),
    C("td-patience-negative", T, ["--patience", "-1"], expect="--patience"),
    C("td-with-data-alone", T, ["--with-data"], expect="--with-data"),
    C("td-self-generate-zero", T, ["--self-generate", "0"], expect="--self-generate"),
    C("td-self-generate-huge", T, ["--self-generate", HUGE], expect="--self-generate"),
    C(
        "td-tokens-and-self-generate",
        T,
        ["--tokens", "{tmp}/tokens.safetensors", "--self-generate", "4"],
        token_file("length"),
        "not both",
    ),
    C("td-tokens-missing", T, ["--tokens", "{tmp}/nope.safetensors"], expect="nope.safetensors"),
    C("td-tokens-garbage", T, ["--tokens", "{tmp}/tokens.safetensors"], token_file("garbage"), "tokens.safetensors"),
    C(
        "td-tokens-truncated",
        T,
        ["--tokens", "{tmp}/tokens.safetensors"],
        token_file("truncated"),
        "tokens.safetensors",
    ),
    C("td-tokens-1d", T, ["--tokens", "{tmp}/tokens.npy"], token_file("shape"), "tokens.npy"),
    C(
        "td-tokens-too-long",
        T,
        ["--tokens", "{tmp}/tokens.safetensors", "--test-size", "5"],
        token_file("length"),
        "2..64",
    ),
    C(
        "td-tokens-out-of-range",
        T,
        ["--tokens", "{tmp}/tokens.safetensors", "--test-size", "5"],
        token_file("range"),
        "1024",
    ),
    C(
        "td-tokens-bad-labels",
        T,
        ["--tokens", "{tmp}/tokens.safetensors", "--test-size", "5"],
        token_file("labels"),
        "label",
    ),
    C(
        "td-tokens-float",
        T,
        ["--tokens", "{tmp}/tokens.safetensors", "--test-size", "5"],
        token_file("float"),
        "tokens.safetensors",
    ),
    C("td-tokens-pickle", T, ["--tokens", "{tmp}/tokens.pt"], token_file("pickle"), "tokens.pt"),
    C("td-tokens-npz-no-key", T, ["--tokens", "{tmp}/tokens.npz"], token_file("npz"), "tokens.npz"),
    C(
        "td-tokens-test-size-too-big",
        T,
        ["--tokens", "{tmp}/tokens.safetensors", "--test-size", "40"],
        token_file("labels"),
        "--test-size",
    ),
    C("td-conditions-empty", T, ["--self-generate", "4", "--conditions", "{tmp}/c.txt"], files(c__txt="\n"), "c.txt"),
    C(
        "td-conditions-captions-to-c2i",
        T,
        ["--self-generate", "4", "--conditions", "{tmp}/c.txt"],
        files(c__txt="a cat\na dog\n"),
        "class",
    ),
    C(
        "td-data-garbage",
        T,
        ["--data", "{tmp}/fm", "--train-size", "8", "--test-size", "4"],
        idx_dir("truncated-gz"),
        "train",
    ),
    C("td-weights-truncated", T, [*EMB_W], TRUNC_GPT, "fashion_gpt.safetensors"),
    C("td-model-bogus", T, ["--model", "bogus"], expect="unknown model"),
    C("td-device-bogus", T, ["--device", "bogus"], expect="--device"),
    C("td-save-dtype-bogus", T, ["--save-dtype", "int4"], expect="--save-dtype"),
    C("td-shards-without-self-generate", T, ["--shard-index", "0", "--num-shards", "2"], expect="torchrun"),
    C("td-cfg-inf", T, ["--self-generate", "4", "--cfg", "inf"], expect="--cfg"),
    C("td-seed-64bit", T, ["--seed", BIG_SEED], expect="--seed"),
    C("td-damaged-run-json", T, [], files(**{"run/run.json": "]["}), "damaged"),
    C("td-tokens-dir", T, ["--tokens", "{tmp}"], expect="--tokens"),
    C("td-conditions-dir", T, ["--self-generate", "4", "--conditions", "{tmp}"], expect="conditions"),
    C("td-device-cuda", T, ["--device", NO_GPU], expect="cuda"),
    # ---------------------------------------------------------------- scripts
    C("fig-weights-truncated", FIG, [*EMB_W], TRUNC_GPT, "fashion_gpt.safetensors"),
    C("fig-weights-swapped", FIG, [*EMB_W], SWAPPED, "which file goes where"),
    C("fig-weights-missing", FIG, ["--weights", "{tmp}/nope"], expect="does not exist"),
    C("fig-data-garbage", FIG, ["--data", "{tmp}/fm"], idx_dir("garbage-gz"), "t10k"),
    C("fig-seed-64bit", FIG, ["--seed", BIG_SEED], expect="--seed"),
    C("fig-cfg-inf", FIG, ["--cfg", "inf"], expect="--cfg"),
    C("fig-temperature-nan", FIG, ["--temperature", "nan"], expect="--temperature"),
    C("fig-top-p-two", FIG, ["--top-p", "2"], expect="--top-p"),
    C("fig-top-k-negative", FIG, ["--top-k", "-1"], expect="--top-k"),
    C("fig-n-real-zero", FIG, ["--n-real", "0"], expect="--n-real"),
    C("fig-n-samples-huge", FIG, ["--n-samples", HUGE], expect="--n-samples"),
    C("fig-device-bogus", FIG, ["--device", "bogus"], expect="--device"),
    C("fig-out-below-file", FIG, ["--out", "{tmp}/file/fig"], below_file, "below the file"),
    C("te-data-garbage", TE, ["--data", "{tmp}/fm"], idx_dir("garbage-gz"), "train"),
    C("te-data-missing", TE, ["--data", "{tmp}/nope"], expect="--data"),
    C("te-seed-64bit", TE, ["--seed", BIG_SEED], expect="--seed"),
    C("te-threads-negative", TE, ["--threads", "-1"], expect="--threads"),
    C("te-stage-bogus", TE, ["--stage", "both"], expect="--stage"),
    C("te-epochs-other-recipe", TE, ["--epochs", "2"], expect="--recipe embedded-16-long"),
    C("te-epochs-zero", TE, ["--recipe", "embedded-16-long", "--epochs", "0"], expect="--epochs"),
    C("te-min-epochs-negative", TE, ["--recipe", "embedded-16-long", "--min-epochs", "-1"], expect="--min-epochs"),
    C("te-eval-images-zero", TE, ["--recipe", "embedded-16-long", "--eval-images", "0"], expect="--eval-images"),
    C("te-lr-zero", TE, ["--recipe", "embedded-16-long", "--lr", "0"], expect="--lr must be in (0, 1)"),
    C("te-lr-other-recipe", TE, ["--lr", "3e-4"], expect="--recipe embedded-16-long"),
    C("te-device-bogus", TE, ["--device", "bogus"], expect="--device"),
    C("te-out-below-file", TE, ["--out", "{tmp}/file/w"], below_file, "below the file"),
    C("te-run-dir-below-file", TE, ["--run-dir", "{tmp}/file/r"], below_file, "below the file"),
    C("te-gpt-without-vq", TE, ["--stage", "gpt", "--out", "{tmp}/empty"], expect="--stage vq"),
    C(
        "te-gpt-vq-truncated",
        TE,
        ["--stage", "gpt", "--out", "{tmp}/w"],
        embedded_weights(lambda d: truncated(d / "fashion_vq.safetensors", d / "fashion_vq.safetensors")),
        "fashion_vq.safetensors",
    ),
    C("tf-data-garbage", TF, ["--data", "{tmp}/fm"], idx_dir("garbage-gz"), "train"),
    C("tf-epochs-zero", TF, ["--epochs", "0"], expect="--epochs"),
    C("tf-seed-negative", TF, ["--seed", "-1"], expect="--seed"),
    C("tf-ckpt-every-zero", TF, ["--ckpt-every", "0"], expect="--ckpt-every"),
    C("tf-out-below-file", TF, ["--out", "{tmp}/file/w"], below_file, "below the file"),
    C("tf-run-dir-below-file", TF, ["--run-dir", "{tmp}/file/r"], below_file, "below the file"),
    C("tf-damaged-checkpoint", TF, [], files(**{"run/checkpoint.pt": "garbage"}), "checkpoint.pt"),
    C("tt-corpus-missing", TT, ["--corpus", "{tmp}/nope.txt"], expect="nope.txt"),
    C("tt-corpus-binary", TT, ["--corpus", "{tmp}/c.txt"], files(c__txt=b"\xff\xfe\x00\x00\x81" * 50), "c.txt"),
    C("tt-corpus-empty", TT, ["--corpus", "{tmp}/c.txt"], files(c__txt=""), "corpus"),
    C("tt-corpus-dir", TT, ["--corpus", "{tmp}"], expect="corpus"),
    C(
        "tt-image-weights-missing",
        TT,
        ["--no-progress", "--out", "{tmp}/out", "--run-dir", "{tmp}/run", "--image-weights", "{tmp}/nope"],
        expect="nope",
        base=False,
    ),
    C(
        "tt-image-weights-truncated",
        TT,
        ["--no-progress", "--out", "{tmp}/out", "--run-dir", "{tmp}/run", "--image-weights", "{tmp}/w"],
        both(TRUNC_GPT, lambda tmp: shutil.copy(AW / "embedded_metrics.json", tmp / "w")),
        "fashion_gpt.safetensors",
        base=False,
    ),
    C("tt-test-every-zero", TT, ["--test-every", "0"], expect="--test-every"),
    C("tt-token-budget-negative", TT, ["--token-budget", "-5"], expect="--token-budget"),
    C("tt-seed-64bit", TT, ["--seed", BIG_SEED], expect="--seed"),
    C("tt-threads-negative", TT, ["--threads", "-2"], expect="--threads"),
    C("tt-device-bogus", TT, ["--device", "bogus"], expect="--device"),
    C("tt-drafter-train-size-negative", TT, ["--drafter-train-size", "-1"], expect="--drafter-train-size"),
    C("tt-drafter-tokens-below-file", TT, ["--drafter-tokens", "{tmp}/file/r"], below_file, "below the file"),
    C("tt-out-below-file", TT, ["--out", "{tmp}/file/w"], below_file, "below the file"),
    # ---------------------------------------------------------------- benchmarks
    C("bt-methods-bogus", "benchmarks/bench_throughput.py", ["--methods", "medusa"], expect="--methods"),
    C("bt-batch-sizes-zero", "benchmarks/bench_throughput.py", ["--batch-sizes", "0"], expect="--batch-sizes"),
    C("bt-device-bogus", "benchmarks/bench_throughput.py", ["--device", "bogus"], expect="--device"),
    C(
        "bt-lantern-text-twin",
        "benchmarks/bench_throughput.py",
        ["--models", "text-twin", "--methods", "ar,lantern", "--batch-sizes", "1"],
        expect="codebook",
    ),
    C("bdist-ks-too-large", "benchmarks/bench_distortion.py", ["--vocab", "64", "--ks", "64"], expect="--ks"),
    C("bdist-delta-above-one", "benchmarks/bench_distortion.py", ["--deltas", "0.1,2"], expect="--deltas"),
    C("bdist-positions-zero", "benchmarks/bench_distortion.py", ["--positions", "0"], expect="--positions"),
    C("ba-k-zero", BA, ["--k", "0"], expect="--k"),
    C("ba-k-too-large", BA, ["--k", "20000"], expect="--k"),
    C("ba-gamma-zero", BA, ["--gamma", "0"], expect="--gamma"),
    C("ba-gamma-huge", BA, ["--gamma", "1000000000"], expect="--gamma"),
    C("ba-position-huge", BA, ["--position", HUGE], expect="--position"),
    C("ba-delta-nan", BA, ["--delta", "nan"], expect="--delta"),
    C("ba-delta-negative", BA, ["--delta", "-1"], expect="--delta"),
    C("ba-repeats-zero", BA, ["--repeats", "0"], expect="--repeats"),
    C("ba-device-bogus", BA, ["--device", "bogus"], expect="--device"),
    C("ba-threads-negative", BA, ["--threads", "-1"], expect="--threads"),
    C("ba-out-below-file", BA, ["--out", "{tmp}/file/a.json"], below_file, "below the file"),
    C("bd-ks-text", BD, ["--ks", "a,b"], expect="--ks"),
    C("bd-ks-empty", BD, ["--ks", ""], expect="--ks"),
    C("bd-ks-too-large", BD, ["--ks", "4096", "--num-images", "1"], expect="--ks"),
    C("bd-deltas-text", BD, ["--deltas", "x"], expect="--deltas"),
    C("bd-deltas-negative", BD, ["--deltas", "-0.1"], expect="--deltas"),
    C("bd-temperatures-nan", BD, ["--temperatures", "nan"], expect="--temperatures"),
    C("bd-lams-below-one", BD, ["--lams", "0.5"], expect="--lams"),
    C("bd-sd-gammas-zero", BD, ["--sd-gammas", "0,2"], expect="--sd-gammas"),
    C("bd-sd-tree-sizes-zero", BD, ["--sd-tree-sizes", "0"], expect="--sd-tree-sizes"),
    C("bd-top-p-above-one", BD, ["--top-p", "1.5"], expect="--top-p"),
    C("pe-ks-too-large", "benchmarks/probe_emitted_tokens.py", ["--ks", "16384", "--num-images", "1"], expect="--ks"),
    C("bd-gamma-zero", BD, ["--gamma", "0"], expect="--gamma"),
    C("bd-gamma-huge", BD, ["--gamma", "1000000000", "--num-images", "1"], expect="--gamma"),
    C("bd-num-images-zero", BD, ["--num-images", "0"], expect="--num-images"),
    C("bd-static-bogus", BD, ["--static", "oak"], expect="--static"),
    C(
        "bd-drafter-garbage",
        BD,
        ["--drafter", "{tmp}/d.safetensors", "--num-images", "1"],
        files(d__safetensors="nope"),
        "d.safetensors",
    ),
    C("bd-device-bogus", BD, ["--device", "bogus"], expect="--device"),
    C("bd-out-below-file", BD, ["--out", "{tmp}/file/o"], below_file, "below the file"),
    C("bd-figure-below-file", BD, ["--figure", "{tmp}/file/f"], below_file, "below the file"),
    C("bd-cfg-inf", BD, ["--cfg", "inf"], expect="--cfg"),
    C("bn-shapes-bogus", BN, ["--shapes", "llamagen-vq99"], expect="--shapes"),
    C("bn-shapes-empty", BN, ["--shapes", ","], expect="--shapes"),
    C("bn-k-zero", BN, ["--k", "0"], expect="--k"),
    C("bn-k-huge", BN, ["--k", HUGE], expect="--k"),
    C("bn-threads-zero", BN, ["--threads", "0"], expect="--threads"),
    C("bn-official-bytes-zero", BN, ["--official-bytes", "0"], expect="--official-bytes"),
    C("bn-skip-bogus", BN, ["--skip", "faiss"], expect="--skip"),
    C("bn-out-below-file", BN, ["--out", "{tmp}/file/n.json"], below_file, "below the file"),
    C("bs-command-bogus", BS, ["--command", "train"], expect="--command"),
    C("bs-procs-zero", BS, ["--procs", "0"], expect="--procs"),
    C("bs-repeats-zero", BS, ["--repeats", "0"], expect="--repeats"),
    C("bs-num-images-zero", BS, ["--num-images", "0"], expect="--num-images"),
    C("bs-num-images-huge", BS, ["--num-images", HUGE], expect="--num-images"),
    C("bs-out-below-file", BS, ["--out", "{tmp}/file/s.json"], below_file, "below the file"),
    C("pd-ks-text", PD, ["--ks", "a"], expect="--ks"),
    C("pd-ks-zero", PD, ["--ks", "0"], expect="--ks"),
    C("pd-ks-too-large", PD, ["--ks", "1024", "--num-images", "1"], expect="--ks"),
    C("pd-deltas-nan", PD, ["--deltas", "nan"], expect="--deltas"),
    C("pd-deltas-empty", PD, ["--deltas", ""], expect="--deltas"),
    C("pd-num-images-zero", PD, ["--num-images", "0"], expect="--num-images"),
    C("pd-num-images-huge", PD, ["--num-images", HUGE], expect="--num-images"),
    C("pd-cfg-inf", PD, ["--cfg", "inf"], expect="--cfg"),
    C("pd-seed-negative", PD, ["--seed", "-1"], expect="--seed"),
    C("pd-out-below-file", PD, ["--out", "{tmp}/file/d.json"], below_file, "below the file"),
]


def _pngs(folder: Path, sizes: list) -> None:
    from PIL import Image

    folder.mkdir(parents=True)
    for i, (h, w) in enumerate(sizes):
        Image.new("L", (w, h), 128).save(folder / f"{i}.png")


def _set_image_column(run: Path, column: str, value) -> None:
    import pandas as pd

    df = pd.read_parquet(run / "images.parquet")
    df[column] = value
    df.to_parquet(run / "images.parquet", index=False)
    _reseal(run, "images.parquet")  # as if the run had been generated so (a changed final file is its own case)


def _reseal(run: Path, name: str) -> None:
    """Record the current SHA-256 of ``run/name`` in the run's seal (ambiguity.runs.RunDir.seal)."""
    from ambiguity.runs import RUN_FILE, SEAL_KEY, file_sha256

    record = json.loads((run / RUN_FILE).read_text())
    record[SEAL_KEY][name] = file_sha256(run / name)
    (run / RUN_FILE).write_text(json.dumps(record))


# --------------------------------------------------------------------------- token ids and LlamaGen grids
def negative_tokens(tmp: Path) -> None:
    """A setup: ``{tmp}/tokens.safetensors`` whose codes hold one -1 (indexed as the last code before)."""
    import torch
    from safetensors.torch import save_file

    tokens = torch.zeros(40, 64, dtype=torch.long)
    tokens[7, 3] = -1
    save_file({"tokens": tokens, "labels": torch.zeros(40, dtype=torch.long)}, str(tmp / "tokens.safetensors"))


def janus_word_beyond_vocab(tmp: Path) -> None:
    """A setup: a tiny Janus in ``{tmp}/janus`` whose tokenizer maps "zebra" past the embedding table,
    and ``{tmp}/caps.txt`` asking for a zebra."""
    from hf_tiny import save, tiny_janus

    model, tok = tiny_janus()
    tok.add_tokens(["zebra"])
    save(model, tok, tmp / "janus")
    write(tmp / "caps.txt", "a zebra\n")


STAGE2_NAME = files(t2i_XL_stage2_512__pt="not read: the names are checked first")
CASES += [
    C(
        "td-tokens-negative",
        T,
        ["--tokens", "{tmp}/tokens.safetensors", "--test-size", "5"],
        negative_tokens,
        "image code -1 is outside the valid range 0..1023",
    ),
    C(
        "prof-caption-word-beyond-vocab",
        P,
        ["--model", "janus-pro-1b", "--weights", "{tmp}/janus", "--captions", "{tmp}/caps.txt", "--num-images", "1"],
        janus_word_beyond_vocab,
        "token id 105 ('zebra'), outside the valid range 0..104",
    ),
    C("td-image-size-not-llamagen", T, ["--image-size", "256"], expect="drop --image-size"),
    C("td-image-size-zero", T, ["--image-size", "0"], expect="--image-size"),
    C(
        "td-image-size-against-file-name",
        T,
        ["--model", "llamagen-t2i-stage2", "--weights", "{tmp}/t2i_XL_stage2_512.pt", "--image-size", "256"],
        STAGE2_NAME,
        "--image-size 256 says 256 px but the file name t2i_XL_stage2_512.pt says 512 px",
    ),
    C(
        "td-image-size-not-multiple-of-16",
        T,
        ["--model", "llamagen-t2i-stage2", "--weights", "{tmp}/t2i_XL_stage2_512.pt", "--image-size", "500"],
        STAGE2_NAME,
        "multiple of 16",
    ),
]


# --------------------------------------------------------------------------- running and judging
def _env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "FASHION_MNIST", "AMBIGUITY_"))}
    env.update(
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        MPLBACKEND="Agg",
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(tmp / "hf-cache"),
        HF_HOME=str(tmp / "hf-home"),
        AMBIGUITY_NEIGHBOURHOOD_CACHE=str(tmp / "nb-cache"),
        PYTHONPATH=str(ROOT),
    )
    return env


@dataclass
class Outcome:
    code: int
    stderr: str
    problems: list = field(default_factory=list)


def error_lines(stderr: str) -> list[str]:
    """Non-empty stderr lines without progress-bar output (the text after the last carriage
    return of a line, and lines that look like tqdm bars)."""
    out = []
    for line in stderr.splitlines():
        line = line.rsplit("\r", 1)[-1].strip()
        if line and not TQDM.search(line):
            out.append(line)
    return out


def judge(case: Case, code: int, stderr: str) -> list[str]:
    """What is wrong with a case's outcome (empty when it is one error line, exit 2, no traceback)."""
    problems = []
    if code != 2:
        problems.append(f"exit status {code}, not 2")
    if "Traceback" in stderr:
        problems.append("traceback")
    lines = error_lines(stderr)
    notes = [ln for ln in lines[:-1] if ln.startswith("note: ")]
    if not lines or not lines[-1].startswith("error: ") or len(notes) != len(lines) - 1:
        problems.append(f"stderr is not (notes +) one error line: {len(lines)} lines")
    elif case.expect and case.expect.lower() not in lines[-1].lower():
        problems.append(f"error line lacks {case.expect!r}")
    return problems


class Launcher:
    """Runs commands one at a time: forked from a warm interpreter (tests/cli_launcher.py), or, with
    ``BAD_INPUTS_FRESH=1``, each in a fresh ``python`` process. ``run`` -> (exit status, stderr)."""

    def __init__(self, root: Path):
        self.root, self.proc = root, None
        if not os.environ.get("BAD_INPUTS_FRESH"):
            env = {**_env(root), "PYTHONPATH": str(ROOT)}
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "cli_launcher.py")],
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                cwd=root,
            )
            assert json.loads(self.proc.stdout.readline()).get("ready"), "cli_launcher did not start"

    def run(self, argv: list[str], cwd: Path, env: dict) -> tuple[int, str]:
        if self.proc is None:
            try:
                p = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=TIMEOUT)
                return p.returncode, p.stderr
            except subprocess.TimeoutExpired as exc:
                return -9, f"timed out after {TIMEOUT} s\n{exc.stderr or ''}"
        out, err = cwd / ".stdout", cwd / ".stderr"
        self.proc.stdin.write(
            json.dumps({"argv": argv[1:], "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}) + "\n"
        )
        self.proc.stdin.flush()
        pid = json.loads(self.proc.stdout.readline())["pid"]
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        code = json.loads(self.proc.stdout.readline())["code"]
        text = err.read_text(errors="replace")
        return code, text if ready else f"timed out after {TIMEOUT} s\n{text}"

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def run_case(case: Case, tmp: Path, launcher: Launcher) -> Outcome:
    tmp.mkdir(parents=True, exist_ok=True)
    if case.setup is not None:
        case.setup(tmp)
    code, stderr = launcher.run(case.argv(tmp), tmp, _env(tmp))
    return Outcome(code, stderr, judge(case, code, stderr))


def run_all(
    cases: list[Case],
    root: Path,
    workers: Optional[int] = None,
    report: Optional[Callable[[Case, Outcome], None]] = None,
) -> dict[str, Outcome]:
    """Run ``cases`` a few at a time, each in ``root/<id>``; {id: Outcome}. ``report`` sees each
    outcome as it comes."""
    global SHARED
    SHARED = SHARED or Shared(root / "_shared")
    SHARED.root.mkdir(parents=True, exist_ok=True)
    todo: queue.Queue = queue.Queue()
    for c in cases:
        todo.put(c)
    results: dict[str, Outcome] = {}

    def worker() -> None:
        launcher = Launcher(root)
        try:
            while True:
                try:
                    case = todo.get_nowait()
                except queue.Empty:
                    return
                results[case.id] = run_case(case, root / case.id, launcher)
                if report is not None:
                    report(case, results[case.id])
        finally:
            launcher.close()

    workers = workers or max(2, min(4, os.cpu_count() or 2))
    threads = [threading.Thread(target=worker) for _ in range(min(workers, len(cases)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict[str, Outcome]:
    """Every selected case's outcome, computed together (in parallel) on first use."""
    chosen = {
        item.callspec.params["case"].id
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        and hasattr(item, "callspec")
        and "case" in item.callspec.params
    }
    return run_all([c for c in CASES if c.id in chosen], tmp_path_factory.mktemp("bad_inputs"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gives_one_line_and_exit_2(case, outcomes):
    out = outcomes[case.id]
    assert not out.problems, f"{case.id}: {'; '.join(out.problems)}\n--- stderr:\n{out.stderr[-3000:]}"


class _FixedWidthEncoder:
    """A caption encoder whose features are ``width`` wide (a T5 of another size)."""

    def __init__(self, width: int, tokens: int):
        self.width, self.tokens = width, tokens

    def encode(self, captions):
        import torch

        return torch.zeros(len(captions), self.tokens, self.width), torch.ones(len(captions), self.tokens, dtype=bool)


def test_caption_encoder_of_another_width_is_one_line():
    """A T5 whose width differs from the GPT's caption dimension (LlamaGen t2i): a UsageError naming
    both widths, not ``Sizes of tensors must match``. In-process: a real-size t2i GPT is too large
    to load in a subprocess case."""
    import torch

    from ambiguity.errors import UsageError
    from ambiguity.models.gpt import GPT, GPTConfig
    from ambiguity.models.llamagen import LlamaGenModel

    torch.manual_seed(0)
    gpt = GPT(
        GPTConfig(
            dim=32,
            n_layer=1,
            n_head=2,
            vocab_size=64,
            block_size=16,
            model_type="t2i",
            caption_dim=16,
            cls_token_num=4,
            multiple_of=32,
        )
    )
    model = LlamaGenModel(gpt, name="llamagen-t2i-tiny", caption_encoder=_FixedWidthEncoder(8, 4))
    with pytest.raises(UsageError, match="gives 8-wide features but llamagen-t2i-tiny takes 16") as err:
        model.make_prompt(["a cat"], guided=True)
    assert "\n" not in str(err.value)
    model.caption_encoder = _FixedWidthEncoder(16, 4)
    assert model.make_prompt(["a cat"], guided=True).inputs["cond"].shape == (2, 4, 16)
    with pytest.raises(UsageError, match="class-conditional"):
        LlamaGenModel(
            GPT(GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=64, block_size=16, multiple_of=32)), name="c2i"
        ).make_prompt(["a cat"])


if __name__ == "__main__":  # python tests/test_bad_inputs.py [ID_SUBSTRING ...]: run and print the tally
    import tempfile
    import time

    want = sys.argv[1:]
    todo = [c for c in CASES if not want or any(w in c.id for w in want)]
    t0 = time.perf_counter()

    def show(case: Case, out: Outcome) -> None:
        if out.problems:
            tail = "\n    ".join(out.stderr.strip().splitlines()[-4:])
            print(f"FAIL {case.id}: {'; '.join(out.problems)}\n    {tail}", flush=True)

    with tempfile.TemporaryDirectory() as d:
        res = run_all(todo, Path(d), report=show)
    bad = [k for k, v in res.items() if v.problems]
    print(
        f"{len(todo) - len(bad)} of {len(todo)} cases give one error line and exit 2 ({time.perf_counter() - t0:.0f} s)"
    )


# --------------------------------------------------------------------------- before the weights (issue 20, item 13)
def _no_weights(monkeypatch) -> None:
    """Make every weight reader fail: a check that comes after one of them fails the test."""
    import safetensors.torch
    import torch
    from transformers import Emu3ForConditionalGeneration, JanusForConditionalGeneration

    import ambiguity.models.embedded as embedded

    def never(*a, **k):
        raise AssertionError("weights were read before the options were checked")

    monkeypatch.setattr(embedded, "load_embedded", never)
    monkeypatch.setattr(safetensors.torch, "load_file", never)
    monkeypatch.setattr(torch, "load", never)
    for cls in (Emu3ForConditionalGeneration, JanusForConditionalGeneration):
        monkeypatch.setattr(cls, "from_pretrained", never)


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    """Random-weight Emu3 (20 codes) and Janus (24 codes) checkpoints in the transformers layout."""
    from hf_tiny import save, tiny_emu3, tiny_janus

    root = tmp_path_factory.mktemp("tiny_hf")
    return {
        "emu3-gen": save(*tiny_emu3(codebook=20), root / "emu3"),
        "janus-pro-1b": save(*tiny_janus(), root / "janus"),
    }


def test_spec_sizes_come_from_the_config_and_the_registry(tiny_checkpoints, monkeypatch, tmp_path):
    """V of a transformers checkpoint is read from its config.json (no weights); the shipped and
    official models' V and class count come from the registry; --weights makes them unknown."""
    from hf_tiny import use_hf_cache

    from ambiguity.models.registry import get_spec, spec_sizes

    _no_weights(monkeypatch)
    use_hf_cache(monkeypatch, tmp_path / "empty")
    assert spec_sizes(get_spec("emu3-gen"), tiny_checkpoints["emu3-gen"]) == {"codes": 20, "classes": None}
    assert spec_sizes(get_spec("janus-pro-1b"), tiny_checkpoints["janus-pro-1b"]) == {"codes": 24, "classes": None}
    assert spec_sizes(get_spec("emu3-gen")) == {"codes": None, "classes": None}  # not in the (empty) cache
    assert spec_sizes(get_spec("embedded")) == {"codes": 1024, "classes": 10}
    assert spec_sizes(get_spec("embedded-16")) == {"codes": 16384, "classes": 10}
    assert spec_sizes(get_spec("llamagen-c2i-b")) == {"codes": 16384, "classes": 1000}
    assert spec_sizes(get_spec("embedded"), "my_weights") == {"codes": None, "classes": None}


@pytest.mark.parametrize(
    "model,options,expect",
    [
        ("emu3-gen", dict(k=20), "--k 20 must be smaller than the vocabulary size 20 of emu3-gen; lower --k"),
        ("janus-pro-1b", dict(tree_top_k=25), "--tree-top-k 25 exceeds the vocabulary size 24 of janus-pro-1b"),
        ("emu3-gen", dict(classes=[3]), "emu3-gen is not class-conditional (t2i); drop --classes"),
        ("embedded", dict(k=1024), "--k 1024 must be smaller than the vocabulary size 1024 of embedded"),
        ("embedded", dict(classes=[0, 10]), "class 10 is out of range for embedded; pass --classes in 0..9"),
        ("embedded", dict(captions="caps.txt"), "embedded is class-conditional; drop --captions"),
        ("text-twin", dict(classes=[3]), "text-twin is not class-conditional (text); drop --classes"),
    ],
)
def test_options_that_cannot_fit_are_refused_before_the_weights(tiny_checkpoints, monkeypatch, model, options, expect):
    from ambiguity.errors import UsageError
    from ambiguity.models.registry import check_spec_options

    _no_weights(monkeypatch)
    with pytest.raises(UsageError) as err:
        check_spec_options(model, tiny_checkpoints.get(model), **options)
    assert str(err.value).startswith(expect) and "\n" not in str(err.value)


def test_options_that_fit_pass_the_spec_check(tiny_checkpoints, monkeypatch):
    from ambiguity.models.registry import check_spec_options

    _no_weights(monkeypatch)
    check_spec_options("emu3-gen", tiny_checkpoints["emu3-gen"], k=19, tree_top_k=20, captions="caps.txt")
    check_spec_options("embedded", None, k=1023, classes=[0, 9])
    check_spec_options("embedded", "other.safetensors", k=5000, classes=[12])  # sizes unknown: checked after loading


@pytest.mark.parametrize(
    "module,argv,expect",
    [
        (
            "ambiguity.neighbourhood",
            ["--model", "emu3-gen", "--weights", "{emu3-gen}", "--k", "25"],
            "vocabulary size 20",
        ),
        ("ambiguity.profile", ["--model", "emu3-gen", "--weights", "{emu3-gen}", "--classes", "1"], "drop --classes"),
        ("ambiguity.profile", ["--classes", "0,10"], "0..9"),
        ("lantern.drafter.train", ["--classes", "11"], "0..9"),
        ("ambiguity.analyses.concentration", ["--classes", "10"], "0..9"),
    ],
)
def test_commands_refuse_before_loading(tiny_checkpoints, monkeypatch, tmp_path, capsys, module, argv, expect):
    """The command line gives the one-line error with exit 2 and never reaches a weight reader."""
    import importlib

    _no_weights(monkeypatch)
    monkeypatch.chdir(tmp_path)
    argv = [a.format(**{k: str(v) for k, v in tiny_checkpoints.items()}) for a in argv]
    assert importlib.import_module(module).main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and expect in err and "\n" not in err
