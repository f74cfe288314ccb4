"""Run records: the settings a run directory stores and compares (:class:`ambiguity.runs.RunDir`).

Canonical JSON of the settings and its digest, the first difference between two records named by
relevance (the model first), the facts added to records later (weights digests) that an older
record may lack, and the package versions stored beside the settings.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Mapping
from importlib import metadata

import numpy as np
import torch

from ambiguity.io import json_default

__all__ = [
    "normalise",
    "settings_digest",
    "settings_difference",
    "FIRST_SETTINGS",
    "LATER_KEYS",
    "without_later_keys",
    "later_keys_missing",
    "versions",
]


def normalise(obj):
    """``obj`` as plain JSON values (tuples -> lists, paths and dtypes -> strings), for comparing records."""
    return json.loads(json.dumps(obj, default=json_default, sort_keys=True))


def settings_digest(settings: Mapping) -> str:
    """First 16 hex digits of the SHA-256 of the canonical JSON of ``settings``."""
    return hashlib.sha256(json.dumps(normalise(settings), sort_keys=True).encode()).hexdigest()[:16]


# settings named first when several differ: what a user changes most deliberately (the model, its
# weights, the method, the data), then the rest alphabetically
FIRST_SETTINGS = (
    "model",
    "name",
    "weights",
    "weights_digest",
    "drafter_digest",
    "method",
    "source",
    "dataset",
    "data",
    "tokens",
    "self_generate",
)


def _relevance(key: str) -> tuple:
    return (FIRST_SETTINGS.index(key) if key in FIRST_SETTINGS else len(FIRST_SETTINGS), key)


def settings_difference(old, new, prefix: str = "") -> str:
    """The most relevant setting that differs between a stored record ``old`` (parsed JSON, None
    when unreadable) and ``new``, as ``"key: <old> there, <new> now"`` (nested dicts are
    descended, ``outer.inner``): keys of :data:`FIRST_SETTINGS` in that order (the model first),
    then the others alphabetically."""
    new = normalise(new)
    if old is None and not prefix:
        return "unreadable run file"
    if not isinstance(old, dict) or not isinstance(new, dict):
        return f"{prefix or 'settings'}: {old!r} there, {new!r} now"
    for k in sorted(set(old) | set(new), key=_relevance):
        if old.get(k) != new.get(k):
            name = f"{prefix}.{k}" if prefix else k
            if isinstance(old.get(k), dict) and isinstance(new.get(k), dict):
                return settings_difference(old[k], new[k], name)
            return f"{name}: {old.get(k)!r} there, {new.get(k)!r} now"
    return "unreadable run file"


#: facts added to run records after runs were made with records lacking them: a stored record
#: without one of these keys continues when everything else agrees (the check is then skipped);
#: ``drafter_digest`` is :func:`lantern.drafter.model.drafter_digest` (named here, not imported)
LATER_KEYS = frozenset({"weights_digest", "drafter_digest"})


def without_later_keys(old, new):
    """``new`` less the :data:`LATER_KEYS` that ``old`` lacks at the same place (nested dicts descended)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    return {
        k: without_later_keys(old[k], v) if k in old else v for k, v in new.items() if k in old or k not in LATER_KEYS
    }


def later_keys_missing(old, new, prefix: str = "") -> set[str]:
    """Dotted names of the :data:`LATER_KEYS` that ``new`` has and ``old`` lacks."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return set()
    found = {f"{prefix}{k}" for k in new if k in LATER_KEYS and k not in old}
    for k in set(old) & set(new):
        found |= later_keys_missing(old[k], new[k], f"{prefix}{k}.")
    return found


def versions() -> dict:
    """Versions of python, torch, numpy, transformers, faiss, pandas and this package (None if absent)."""

    def first(*names):
        for n in names:
            try:
                return metadata.version(n)
            except metadata.PackageNotFoundError:
                continue
        return None

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "transformers": first("transformers"),
        "faiss": first("faiss-cpu", "faiss-gpu-cu12", "faiss-gpu", "faiss"),
        "pandas": first("pandas"),
        "lantern-ambiguity": first("lantern-ambiguity"),
    }
