"""Helpers shared by the embedded-model tests: a tiny fake Fashion-MNIST and loading a script
under ``scripts/`` as a module."""

import importlib.util
from pathlib import Path

import numpy as np

from ambiguity.data.fashion_mnist import write_idx


def write_fake_fashion_mnist(d: Path, n_train: int, n_test: int, seed: int = 0, gzip_train: bool = False) -> Path:
    """IDX files of random 28x28 images (labels 0..9 cycling) in ``d``: train gzipped when asked."""
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    for prefix, n, ext in (("train", n_train, ".gz" if gzip_train else ""), ("t10k", n_test, "")):
        write_idx(d / f"{prefix}-images-idx3-ubyte{ext}", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(d / f"{prefix}-labels-idx1-ubyte{ext}", (np.arange(n) % 10).astype(np.uint8))
    return d


def load_script(path: Path, name: str = ""):
    """The script at ``path`` as a module (its ``main`` etc. callable in-process)."""
    spec = importlib.util.spec_from_file_location(name or path.stem + "_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
