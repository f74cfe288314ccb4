"""Analyses that test LANTERN's premise on any model (Jang et al., ICLR 2025, Sec. 4.1).

* :mod:`.concentration`: how much of the target's probability lies on the latent neighbours
  B_k of its top-1 token, against k random tokens and the best possible k tokens.
* :mod:`.interchangeability`: pixel error after swapping tokens for latent neighbours, against
  swapping them for random tokens.

Run ``python -m ambiguity.analyses {concentration,interchangeability} --help``. The names below
are imported lazily, so ``python -m ambiguity.analyses.<analysis>`` runs without warnings.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "default_ks": "concentration",
    "neighbourhood_mass": "concentration",
    "top_mass": "concentration",
    "run_concentration": "concentration",
    "summarize_concentration": "concentration",
    "replace_tokens": "interchangeability",
    "pixel_errors": "interchangeability",
    "run_interchangeability": "interchangeability",
    "summarize_interchangeability": "interchangeability",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"ambiguity.analyses.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'ambiguity.analyses' has no attribute {name!r}")
