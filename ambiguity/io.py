"""Atomic, resumable file output: nothing half-written is ever left under its final name."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ambiguity.errors import UsageError

__all__ = [
    "atomic_path",
    "sweep_debris",
    "write_json",
    "write_table",
    "read_table",
    "ensure_writable_dir",
    "save_tensors",
    "load_tensors",
    "abspath",
    "json_default",
]


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` atomically.
    ``path``'s directory is created when missing (a long run does not fail at its last write).

    The file gets the mode a plain ``open()`` would give it (0666 less the umask, e.g. 0644):
    ``mkstemp`` creates 0600, and some writers (safetensors' ``save_file``) replace the
    temporary file with a new 0600 one, so the mode is set after the writer is done.

    The temporary name, ``.<name>.w<pid>@<host>.<random>.tmp``, says which process writes it, so
    that the debris of a killed process can be told from a file being written
    (:func:`sweep_debris`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_writer()}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# what atomic_path leaves when its process is killed mid-write: ``.<name>.[w<pid>@<host>.]<mkstemp's 8>.tmp``
_DEBRIS = re.compile(r"^\..+?\.(?:w(\d+)@([A-Za-z0-9-]+)\.)?[a-z0-9_]{8}\.tmp$")


def _host() -> str:
    """This machine's name as temporary names carry it: letters, digits and dashes, at most 32."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"


def _writer() -> str:
    """``w<pid>@<host>``: the writing process, in :func:`atomic_path`'s temporary names."""
    return f"w{os.getpid()}@{_host()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (or an id we cannot ask about): leave its file alone
    return True


def sweep_debris(root: str | Path) -> list[Path]:
    """Remove the temporary files :func:`atomic_path` left under ``root`` (recursively) when its
    process was killed mid-write (a run stopped while it wrote a figure); returns them.

    A file whose writer runs on this host and is still alive (another shard of the run, writing
    now) is kept, and so is one written from another host (its process cannot be asked); a file
    named before writers were recorded (``.<name>.<random>.tmp``) is debris.
    """
    removed, host = [], _host()
    for f in Path(root).rglob(".*.tmp"):
        m = _DEBRIS.match(f.name)
        if m is None or not f.is_file():
            continue
        if m.group(1) and (m.group(2) != host or _alive(int(m.group(1)))):
            continue
        f.unlink(missing_ok=True)
        removed.append(f)
    return removed


def _umask() -> int:
    """The process's file-creation mask, read without changing it where Linux reports it
    (``/proc/self/status``); elsewhere by setting and restoring it (not thread-safe there)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def ensure_writable_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create ``path`` if needed and check it is writable; UsageError naming ``flag`` otherwise
    (a path below a file is named as such)."""
    path = Path(path).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as exc:
        blocker = _file_in_the_way(path)
        if blocker is not None:
            where = "is a file" if blocker == path else f"lies below the file {blocker}"
            raise UsageError(f"{flag} {path} {where}; pass a directory path") from None
        raise UsageError(
            f"cannot write to output directory {path} ({exc.strerror or exc}); pass a writable {flag}"
        ) from None
    return path


def _file_in_the_way(path: Path) -> Path | None:
    """``path`` or its nearest ancestor when that is an existing non-directory, else None."""
    for a in [path, *path.parents]:
        try:
            if a.exists():
                return None if a.is_dir() else a
        except OSError:  # e.g. a name too long for the file system
            continue
    return None


def write_json(obj, path: str | Path) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, default=json_default) + "\n")
    return Path(path)


def json_default(x):
    """JSON encoding of numpy scalars and arrays, tensors and paths (anything else: ``str``)."""
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    return str(x)


def write_table(df, path: str | Path) -> Path:
    """Write a pandas DataFrame as Parquet (``.parquet``) or CSV (``.csv``), atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        if path.suffix == ".parquet":
            df.to_parquet(tmp, index=False)
        else:
            df.to_csv(tmp, index=False)
    return path


def read_table(path: str | Path):
    """A Parquet (``.parquet``) or CSV file -> pandas DataFrame."""
    path = Path(path)
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def save_tensors(tensors: dict, path: str | Path, metadata: dict | None = None) -> Path:
    """safetensors file written atomically; ``metadata`` values are JSON-encoded strings."""
    meta = {k: v if isinstance(v, str) else json.dumps(v, default=json_default) for k, v in (metadata or {}).items()}
    with atomic_path(path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=meta)
    return Path(path)


def load_tensors(path: str | Path, device="cpu") -> tuple[dict, dict]:
    """Read a safetensors file -> (tensors, metadata with JSON values decoded where possible)."""
    tensors, meta = {}, {}
    with safe_open(str(path), framework="pt", device=str(device)) as f:
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
        for k, v in (f.metadata() or {}).items():
            try:
                meta[k] = json.loads(v)
            except (json.JSONDecodeError, TypeError):
                meta[k] = v
    return tensors, meta


def abspath(path: str | Path | None) -> str | None:
    """``path`` made absolute (``~`` expanded) as a string, for run records; None stays None."""
    return str(Path(path).expanduser().resolve()) if path else None
