"""Finding checkpoint files offline: an explicit ``--weights`` path or the local Hugging Face cache.

Nothing here downloads. When a file is absent the error says which repository and file to
download and where to put it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ambiguity.errors import WeightsNotFoundError

__all__ = ["find_weight", "require_weight", "hf_snapshot_dir", "download_hint"]


def download_hint(repo_id: str, filename: str | None = None) -> str:
    what = f"{repo_id} {filename}" if filename else repo_id
    return (
        f"download it with `hf download {what}` (goes to the Hugging Face cache, "
        f"{_hf_cache_dir()}) or pass --weights PATH"
    )


def _hf_cache_dir() -> str:
    try:
        from huggingface_hub.constants import HF_HUB_CACHE

        return str(HF_HUB_CACHE)
    except Exception:  # pragma: no cover - very old hub versions
        return os.path.expanduser("~/.cache/huggingface/hub")


def find_weight(
    filename: str, repo_id: Optional[str], weights: Optional[str | Path] = None, primary: bool = False
) -> Optional[Path]:
    """Locate ``filename``.

    ``weights`` may be a directory holding the file, or (when ``primary``) the file itself
    under any name. Otherwise the local Hugging Face cache of ``repo_id`` is searched,
    without network access. Returns None when absent.
    """
    if weights is not None:
        w = Path(weights).expanduser()
        if w.is_dir():
            cand = w / filename
            return cand if cand.is_file() else None
        if w.is_file():
            if primary or w.name == filename:
                return w
            cand = w.parent / filename
            return cand if cand.is_file() else None
        return None
    if repo_id is None:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo_id, filename)
    except Exception:
        return None
    return Path(hit) if isinstance(hit, (str, os.PathLike)) and Path(hit).is_file() else None


def require_weight(
    filename: str, repo_id: str, weights: Optional[str | Path] = None, primary: bool = False, model: str = ""
) -> Path:
    """Like :func:`find_weight` but raises :class:`WeightsNotFoundError` with a one-line fix."""
    hit = find_weight(filename, repo_id, weights, primary)
    if hit is not None:
        return hit
    where = (
        f"--weights {weights} holds no {filename}"
        if weights is not None
        else f"{filename} is not in the local Hugging Face cache"
    )
    prefix = f"{model}: " if model else ""
    raise WeightsNotFoundError(f"{prefix}{where}; {download_hint(repo_id, filename)}")


def hf_snapshot_dir(
    repo_id: str, weights: Optional[str | Path] = None, model: str = "", must_have: str = "config.json"
) -> Path:
    """A directory with a transformers checkpoint: ``weights`` if given, else the cached snapshot.

    Raises :class:`WeightsNotFoundError` when neither holds ``must_have``.
    """
    prefix = f"{model}: " if model else ""
    if weights is not None:
        w = Path(weights).expanduser()
        if (w / must_have).is_file():
            return w
        raise WeightsNotFoundError(
            f"{prefix}--weights {weights} is not a model directory with {must_have}; {download_hint(repo_id)}"
        )
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(repo_id, local_files_only=True))
        if (path / must_have).is_file():
            return path
    except Exception:
        pass
    raise WeightsNotFoundError(f"{prefix}{repo_id} is not in the local Hugging Face cache; {download_hint(repo_id)}")
