import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

# Copies of ../shared/reference (official-layout checkpoints and the outputs the official code
# computed from them) live in tests/fixtures/reference so a clean clone is self-contained.
REFERENCE = Path(os.environ.get("AMBIGUITY_REFERENCE", Path(__file__).resolve().parent / "fixtures" / "reference"))


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    assert REFERENCE.is_dir(), f"reference fixtures missing at {REFERENCE}"
    return REFERENCE
