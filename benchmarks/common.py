"""What the benchmarks share: where they write by default, their ``--out`` option and the thread and
device set-up of the timing scripts.

The benchmarks are scripts (``python benchmarks/<name>.py``, or loaded from their files by the
tests): each puts the checkout on ``sys.path`` before it imports this module as ``benchmarks.common``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ambiguity.cli import add_out_arg, device_from_args, set_threads

__all__ = ["ROOT", "results_dir", "add_results_arg", "threads_and_device", "torch_facts"]

ROOT = Path(__file__).resolve().parents[1]


def results_dir(script: str) -> Path:
    """``runs/benchmarks/<script>`` in the checkout: a benchmark's default output (git-ignored, so a
    casual run never overwrites the committed ``benchmarks/results/``)."""
    return ROOT / "runs" / "benchmarks" / script


def add_results_arg(ap, script: str, file: Optional[str] = None, what: Optional[str] = None) -> None:
    """``--out``: the results file ``runs/benchmarks/<script>/<file>`` (metavar FILE) or, without
    ``file``, the results directory ``runs/benchmarks/<script>`` (DIR) by default; ``what`` names it
    in the help text (default: "results JSON", or "results directory" without ``file``)."""
    shown = f"runs/benchmarks/{script}" + (f"/{file}" if file else "")
    default = results_dir(script) / file if file else results_dir(script)
    what = what or ("results JSON" if file else "results directory")
    add_out_arg(ap, f"{what} (default: {shown})", default=str(default), metavar="FILE" if file else "DIR")


def threads_and_device(args) -> tuple[torch.device, torch.dtype]:
    """Apply ``--threads`` (:func:`ambiguity.cli.set_threads`; none given: torch's default) and
    resolve ``--device`` / ``--dtype`` -> (device, dtype). Raises UsageError for bad values."""
    set_threads(getattr(args, "threads", 0))
    return device_from_args(args)


def torch_facts(device: torch.device, dtype: torch.dtype) -> dict:
    """What a timing depends on besides its settings: torch version, CPU threads, device and dtype."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
    }
