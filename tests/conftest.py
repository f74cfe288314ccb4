import os
import tempfile

# Tests run tiny models: one thread avoids OpenMP start-up and spin costs that make tiny
# matmuls 10x slower on a 2-core machine, and keeps parallel pytest runs from fighting.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# reference statistics of lantern.evaluate go to a per-session folder, never the user's cache
os.environ.setdefault("LANTERN_EVAL_CACHE", tempfile.mkdtemp(prefix="lantern-eval-cache-"))

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
try:
    import faiss

    faiss.omp_set_num_threads(1)
except ImportError:  # pragma: no cover - faiss is a required dependency
    pass

# Copies of ../shared/reference (official-layout checkpoints and the outputs the official code
# computed from them) live in tests/fixtures/reference so a clean clone is self-contained.
REFERENCE = Path(os.environ.get("AMBIGUITY_REFERENCE", Path(__file__).resolve().parent / "fixtures" / "reference"))


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    assert REFERENCE.is_dir(), f"reference fixtures missing at {REFERENCE}"
    return REFERENCE


@pytest.fixture(autouse=True)
def _close_figures():
    """Close every pyplot figure a test leaves open, so later tests (and the notebook test,
    whose cells draw on ``plt.gca()``) start from a clean pyplot state."""
    yield
    import sys

    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
