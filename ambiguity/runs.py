"""Run directories: one mechanism for settings records, resuming, parts and atomic outputs.

Every command that writes results (profile, the analyses, compare, lantern's generate,
train_drafter, evaluate and paper) keeps them in a run directory::

    <out>/run.json            what the run is: command, settings, their digest, package versions
    <out>/parts/<name>.json   one manifest per finished unit of work (a batch, an image, a cell)
    <out>/parts/<name>.*      the unit's tables (Parquet) and tensors (safetensors)
    <out>/...                 final outputs, each written atomically (summary.json last)

* **Resume**: a rerun with the same settings reads finished parts back instead of computing
  them again, so an interrupted run (even ``kill -9``) loses at most the unit in flight.
* **Refuse / overwrite**: a rerun with other settings is refused with one line that names the
  first difference, ``--out`` and ``--overwrite``; ``--overwrite`` clears the run's own files
  (``run.json``, ``parts/`` and the command's outputs) and starts afresh.
* **Sealed outputs**: :meth:`RunDir.seal` records the SHA-256 of the final files in ``run.json``
  (key ``outputs_sha256``) once they are written; :func:`check_sealed` lets a reader refuse a
  final table, summary or image that is not what the run wrote (copied from another run,
  replaced, duplicated).
* **Honest parts**: a manifest says what its part holds (e.g. the image indices), the settings
  digest it was computed under, and each file's size, row count and SHA-256. :meth:`RunDir.read_part`
  checks all of it; a damaged, truncated, foreign or stale part is recomputed with a one-line
  ``note:`` on stderr, never merged.

* **One unit loop**: a driver opens its run with :meth:`RunDir.open_shared` (shard 0 first),
  walks :func:`shard_units` (this shard's units, each with its finished part or None) computing
  and writing the unfinished ones, then calls :func:`assemble_units` (barrier; shards that do not
  merge return None; the merging one reads every part). :class:`RunOptions` carries what every
  driver takes besides its science: ``out``, ``overwrite``, ``progress`` and the ``shard``.

Which settings belong in the record is the command's choice: everything that changes a result,
nothing that only extends the run (e.g. ``--num-images`` of a generation, which resumes and adds
images).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, TypeVar

from ambiguity.distributed import SINGLE, Shard
from ambiguity.errors import UsageError
from ambiguity.io import (
    ensure_writable_dir,
    load_tensors,
    read_table,
    save_tensors,
    sweep_debris,
    write_json,
    write_table,
)
from ambiguity.run_records import (
    later_keys_missing,
    normalise,
    settings_difference,
    settings_digest,
    versions,
    without_later_keys,
)

__all__ = [
    "RunDir",
    "Part",
    "RunOptions",
    "shard_units",
    "assemble_units",
    "read_units",
    "file_sha256",
    "check_sealed",
    "RUN_FILE",
    "PART_DIR",
    "SEAL_KEY",
]

RUN_FILE = "run.json"
SEAL_KEY = "outputs_sha256"  # run.json: {relative path of a final file: SHA-256}
ABSENT = "it was never written"
PART_DIR = "parts"
T = TypeVar("T")


def file_sha256(path: str | Path) -> str:
    """SHA-256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_sealed(path: str | Path, fix: str, only: Optional[Sequence[str]] = None) -> None:
    """Raise UsageError when a final file of the run at ``path`` is missing or differs from what
    the run wrote (its SHA-256 in ``run.json``, :meth:`RunDir.seal`), naming the file and ``fix``
    (the command that rewrites it). only: check just these relative paths (default: all sealed).
    Runs written before outputs were sealed (no record) pass unchecked."""
    path = Path(path)
    try:
        record = json.loads((path / RUN_FILE).read_text())
    except (OSError, ValueError):
        return
    sealed = record.get(SEAL_KEY) if isinstance(record, dict) else None
    if not isinstance(sealed, dict):
        return
    for name in only if only is not None else sealed:
        if name not in sealed:
            continue
        f = path / name
        if not f.is_file():
            raise UsageError(f"{f} is missing although the run wrote it; {fix}")
        if file_sha256(f) != sealed[name]:
            raise UsageError(
                f"{f} is not the file this run wrote (its SHA-256 differs from the one in "
                f"{path / RUN_FILE}: copied from another run or changed since); {fix}"
            )


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


# --------------------------------------------------------------------------- parts
@dataclass
class Part:
    """A finished unit of work read back by :meth:`RunDir.read_part`.

    tables: name -> pandas DataFrame; tensors: name -> {key: tensor}; files: name -> Path of
    the other files the part listed; meta: the JSON-able extras given to ``write_part``.
    """

    name: str
    holds: dict
    tables: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


class RunDir:
    """A run directory (see the module docstring).

    Args:
        path: the directory (``--out``).
        settings: everything that changes a result (JSON-able); its digest marks every part.
        command: the producing command, e.g. ``"python -m ambiguity.profile"`` (recorded).
        flag: the option that named ``path``, for error messages.
        outputs: final files / directories (relative to ``path``) that ``--overwrite`` removes.
        report: where one-line notes go (default: ``note: ...`` on stderr).
        merge: ``"module:function"`` that assembles the outputs from the parts (recorded in
            ``run.json`` for ``python -m ambiguity merge``).
    """

    def __init__(
        self,
        path: str | Path,
        settings: Mapping,
        *,
        command: str,
        flag: str = "--out",
        outputs: Sequence[str] = (),
        report: Callable[[str], None] = _note,
        merge: Optional[str] = None,
    ):
        self.path = Path(path).expanduser()
        self.settings = normalise(dict(settings))
        self.digest = settings_digest(self.settings)
        self.command, self.flag, self.outputs, self.report, self.merge = command, flag, tuple(outputs), report, merge
        self.notes: list[str] = []

    # ------------------------------------------------------------------ the record
    @property
    def run_file(self) -> Path:
        return self.path / RUN_FILE

    @property
    def parts_dir(self) -> Path:
        return self.path / PART_DIR

    def stored(self) -> Optional[dict]:
        """The parsed ``run.json``, None when absent; raises UsageError when it is unreadable."""
        if not self.run_file.is_file():
            return None
        try:
            record = json.loads(self.run_file.read_text())
            if not isinstance(record, dict) or "settings" not in record:
                raise ValueError
            return record
        except (OSError, ValueError):
            raise UsageError(
                f"{self.flag} {self.path} has a damaged {RUN_FILE}, so its settings are unknown; "
                f"add --overwrite to start afresh or pass another {self.flag}"
            ) from None

    def check(self, only: Optional[Sequence[str]] = None) -> RunDir:
        """Refuse at once when ``path`` holds a run of other settings (nothing is written).

        only: compare just these top-level keys of the settings (e.g. the command-line options,
        before a model is loaded to compute the rest). Raises UsageError naming the first difference.
        """
        record = self.stored()
        if record is None:
            return self
        old, new = record["settings"], self.settings
        if only is not None:
            old = {k: old.get(k) for k in only} if isinstance(old, dict) else old
            new = {k: new.get(k) for k in only}
        if old != new and only is None and old == without_later_keys(old, new):
            # recorded before some facts were (e.g. the weights digest): continue it under its own record
            self.settings, self.digest = old, settings_digest(old)
            later = sorted(later_keys_missing(old, new))
            self.note(f"{self.path} was recorded without {', '.join(later)}, so that cannot be checked; continuing it")
            return self
        if old != new:
            raise UsageError(
                f"{self.flag} {self.path} holds results of a run with other settings "
                f"({settings_difference(old, without_later_keys(old, new))}); pass another {self.flag} or "
                f"add --overwrite"
            )
        return self

    def open(self, overwrite: bool = False, extra: Optional[Mapping] = None, shards: Optional[int] = 1) -> RunDir:
        """Create the directory and record this run, or check that it continues the stored one.

        overwrite: remove the stored run's files first. extra: facts stored with the record but
        not compared. shards: how many shards compute the run (:mod:`ambiguity.distributed`);
        resuming with another number is refused (None: any number may continue the run). A resumed
        run first removes what a killed write left (:func:`ambiguity.io.sweep_debris`).
        Raises UsageError for other settings, another shard count, a damaged ``run.json``, parts
        without a ``run.json`` or an unwritable directory.
        """
        ensure_writable_dir(self.path)
        if overwrite:
            self.clear()
        record = self.check().stored()
        if record is None:
            if self.parts_dir.is_dir() and any(self.parts_dir.iterdir()):
                raise UsageError(
                    f"{self.flag} {self.path} holds parts without their {RUN_FILE}, so their settings "
                    f"are unknown; pass another {self.flag} or add --overwrite"
                )
            write_json(
                {
                    "command": self.command,
                    "settings": self.settings,
                    "digest": self.digest,
                    "shards": shards,
                    "merge": self.merge,
                    "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                    "versions": versions(),
                    **dict(extra or {}),
                },
                self.run_file,
            )
        elif shards is not None and record.get("shards") is not None and int(record["shards"]) != int(shards):
            was = int(record["shards"])
            raise UsageError(
                f"{self.flag} {self.path} was started with {was} shard(s), not {shards}; resume it with "
                f"{was} (torchrun --nproc_per_node={was}, or --num-shards {was}), or pass another "
                f"{self.flag}"
            )
        else:
            sweep_debris(self.path)  # a resumed run: the temporary files of a write that was killed
        self.parts_dir.mkdir(exist_ok=True)
        return self

    def open_shared(
        self, shard: Shard = SINGLE, overwrite: bool = False, extra: Optional[Mapping] = None, any_count: bool = False
    ) -> RunDir:
        """:meth:`open` by the shards of one run: shard 0 first (it clears the run with
        ``overwrite`` and records it), then, after a barrier, the others (they continue it). A
        merging process (``python -m ambiguity merge``) never clears. any_count: any number of
        shards may continue the run (e.g. the paper's rounds); otherwise resuming with another
        shard count is refused. Raises UsageError as :meth:`open`."""
        shards = None if any_count else shard.count
        clear = overwrite and not shard.merging
        return shard.first(lambda: self.open(clear, extra, shards), lambda: self.open(extra=extra, shards=shards))

    def seal(self, names: Sequence[str]) -> None:
        """Record the SHA-256 of the final files ``names`` (relative to the run directory, all
        written) in ``run.json``; readers check them with :func:`check_sealed`.

        An earlier seal is kept for the files not named now: a later pass that rewrites only some
        outputs (``python -m ambiguity merge RUN --no-figures`` rewrites the tables, not the images)
        must not drop the checksums of the others, or a replaced image would be accepted. A run
        started afresh (``--overwrite``) has no earlier seal (:meth:`clear` removes ``run.json``).
        """
        record = self.stored() or {}
        earlier = record.get(SEAL_KEY) if isinstance(record.get(SEAL_KEY), dict) else {}
        record[SEAL_KEY] = {**earlier, **{str(n): file_sha256(self.path / n) for n in names}}
        write_json(record, self.run_file)

    def require_parts(self, names: Sequence[str], holds: Sequence[Mapping], load: bool = True) -> list[Part]:
        """Every part ``names[i]`` holding ``holds[i]``, read back; raises UsageError naming the first
        missing, damaged or foreign ones (merging never mixes in a part that does not belong)."""
        parts, missing = [], []
        for name, h in zip(names, holds):
            part, why = self._inspect_part(name, h, load)
            if part is None:
                missing.append((name, why))
            parts.append(part)
        if missing:
            (name, why), more = missing[0], f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise UsageError(
                f"{self.path} lacks the intact part {name}{more}: {why}; rerun the shard(s) that own "
                f"them (the same command with their --shard-index) and merge again"
            )
        return parts

    def clear(self) -> None:
        """Remove ``run.json``, ``parts/`` and the outputs this command writes (nothing else)."""
        shutil.rmtree(self.parts_dir, ignore_errors=True)
        self.run_file.unlink(missing_ok=True)
        for name in self.outputs:
            p = self.path / name
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ parts
    def manifest_path(self, name: str) -> Path:
        return self.parts_dir / f"{name}.json"

    def write_part(
        self,
        name: str,
        holds: Mapping,
        *,
        tables: Optional[Mapping] = None,
        tensors: Optional[Mapping] = None,
        files: Sequence[str | Path] = (),
        meta: Optional[Mapping] = None,
    ) -> None:
        """Write a finished unit atomically: its tables (``parts/<name>.<table>.parquet``), tensors
        (``parts/<name>.<key>.safetensors``), then the manifest, which lists them and the other
        ``files`` (already written, anywhere under the run directory) with sizes, rows and
        SHA-256. The manifest is written last: its presence means the part is complete."""
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        entries = {}
        for key, df in (tables or {}).items():
            path = write_table(df, self.parts_dir / f"{name}.{key}.parquet")
            entries[path.name] = {"kind": "table", "key": key, "rows": int(len(df))}
        for key, tdict in (tensors or {}).items():
            path = save_tensors(tdict, self.parts_dir / f"{name}.{key}.safetensors")
            entries[path.name] = {"kind": "tensors", "key": key}
        for f in files:
            rel = Path(f).resolve().relative_to(self.path.resolve()).as_posix()
            entries["../" + rel] = {"kind": "file", "key": Path(f).name}
        for rel, e in entries.items():
            p = Path(os.path.normpath(self.parts_dir / rel))
            e.update(bytes=p.stat().st_size, sha256=file_sha256(p))
        write_json(
            {
                "part": name,
                "digest": self.digest,
                "holds": normalise(dict(holds)),
                "files": entries,
                "meta": normalise(dict(meta or {})),
            },
            self.manifest_path(name),
        )

    def read_part(self, name: str, holds: Optional[Mapping] = None, load: bool = True) -> Optional[Part]:
        """The part ``name`` if it is complete, intact and holds ``holds`` under this run's settings.

        holds: what the caller expects the part to hold (None: any). load: parse its tables and
        tensors (False: only check the files; ``Part.files`` then maps every file's key to its path).
        Returns None when it is absent; when it is damaged (unreadable manifest, missing file,
        size/checksum/row mismatch) or foreign (other settings digest, other ``holds``) it also
        returns None, after a one-line note, so that the caller recomputes it.
        """
        part, why = self._inspect_part(name, holds, load)
        if why is not None and why != ABSENT:
            self.note(f"{self.path.name}/{PART_DIR}/{name} is not reused: {why}; recomputing it")
        return part

    def _inspect_part(self, name: str, holds: Optional[Mapping], load: bool) -> tuple[Optional[Part], Optional[str]]:
        """(the part, None) when it is usable, else (None, why not): ABSENT, or why it is damaged or foreign."""
        manifest = self.manifest_path(name)
        if not manifest.is_file():
            return None, ABSENT
        try:
            m = json.loads(manifest.read_text())
            if m.get("digest") != self.digest:
                why = "it was computed under other settings"
            elif holds is not None and m.get("holds") != normalise(dict(holds)):
                why = f"it holds {m.get('holds')} instead of {normalise(dict(holds))}"
            elif m.get("part") != name:
                why = f"its manifest is that of the part {m.get('part')!r}"
            else:
                why = None
            files = m.get("files")
            if why is None and not (isinstance(files, dict) and all(isinstance(e, dict) for e in files.values())):
                why = "its manifest is malformed"
        except (OSError, ValueError, AttributeError, TypeError):
            m, why = {}, "its manifest is unreadable"
        if why is not None:
            return None, why
        part = Part(name, dict(m.get("holds") or {}), meta=dict(m.get("meta") or {}))
        for rel, e in m["files"].items():
            why = self._check_file(part, Path(os.path.normpath(self.parts_dir / rel)), e, load)
            if why is not None:
                return None, why
        return part, None

    @staticmethod
    def _check_file(part: Part, path: Path, entry: dict, load: bool) -> Optional[str]:
        """Check one file of a part against its manifest entry and load it into ``part``; the
        reason it cannot be used, or None."""
        if not path.is_file():
            return f"{path.name} is missing"
        if path.stat().st_size != entry.get("bytes") or file_sha256(path) != entry.get("sha256"):
            return f"{path.name} is damaged (checksum mismatch)"
        kind, key = entry.get("kind"), entry.get("key")
        if not load or kind == "file":
            part.files[key if kind == "file" else path.name] = path
            return None
        try:
            if kind == "table":
                df = read_table(path)
                if len(df) != entry.get("rows"):
                    return f"{path.name} has {len(df)} rows, not {entry.get('rows')}"
                part.tables[key] = df
            else:
                part.tensors[key] = load_tensors(path)[0]
        except Exception as exc:  # a file that passes the checksum but cannot be parsed
            return f"{path.name} cannot be read ({type(exc).__name__})"
        return None

    def drop_part(self, name: str) -> None:
        """Remove the part ``name``: its manifest first (so that it no longer counts as complete),
        then its files under ``parts/``; files it lists elsewhere in the run are kept. Absent: nothing."""
        manifest = self.manifest_path(name)
        try:
            files = json.loads(manifest.read_text()).get("files", {})
        except (OSError, ValueError, AttributeError):
            files = {}
        manifest.unlink(missing_ok=True)
        for rel in files if isinstance(files, dict) else ():
            path = Path(os.path.normpath(self.parts_dir / rel))
            if path.parent == self.parts_dir and path.name.startswith(f"{name}."):
                path.unlink(missing_ok=True)

    def part_names(self, prefix: str = "") -> list[str]:
        """Names of the parts whose manifests exist (sorted), optionally only those starting with ``prefix``."""
        if not self.parts_dir.is_dir():
            return []
        return sorted(p.name[:-5] for p in self.parts_dir.glob(f"{prefix}*.json"))

    def note(self, text: str) -> None:
        """Record and report a one-line note."""
        self.notes.append(text)
        self.report(text)


# --------------------------------------------------------------------------- the sharded unit loop
def shard_units(
    run: Optional[RunDir],
    units: Sequence[tuple[str, Mapping]],
    shard: Shard,
    load: bool = True,
    every_shard: bool = False,
) -> Iterator[tuple[int, Optional[Part]]]:
    """The units of a run that are this shard's, in order, each with its finished part (None: to compute).

    The one place that decides which units a shard computes and which are already done. A driver
    opens the run with :meth:`RunDir.open_shared`, loops ``for i, done in shard_units(run, units,
    shard)``: it takes ``done`` (resumed) or computes unit ``i`` and writes its part, then calls
    :func:`assemble_units`.

    Args:
        run: the opened run directory, or None (no ``--out``: nothing is resumed).
        units: ``(part name, holds)`` of every unit of the whole run; unit ``i`` is shard ``i % count``'s.
        shard: :class:`ambiguity.distributed.Shard` (``SINGLE`` for one process).
        load: read the part's tables and tensors (False: only check its files).
        every_shard: every shard takes part in every unit (a unit split further inside, e.g. a
            paper item whose decoding sessions split their rounds; the merging shard writes its
            part) and the shards wait for each other after each unit.
    Yields (i, Part or None).
    """
    for i, (name, holds) in enumerate(units):
        if every_shard or shard.owns(i):
            yield i, (run.read_part(name, holds, load=load) if run is not None else None)
            if every_shard:
                shard.barrier()  # runs when the driver asks for the next unit: after it finished this one


def read_units(
    run: RunDir, units: Sequence[tuple[str, Mapping]], read: Callable[[Part], T] = lambda part: part, load: bool = True
) -> list[T]:
    """``read(part)`` of every unit's part, in unit order; raises UsageError naming the first
    missing, damaged or foreign part (:meth:`RunDir.require_parts`)."""
    names, holds = zip(*units)
    return [read(p) for p in run.require_parts(names, holds, load=load)]


def assemble_units(
    run: Optional[RunDir],
    units: Sequence[tuple[str, Mapping]],
    shard: Shard,
    own: Optional[list[T]],
    read: Callable[[Part], T],
    every_rank: bool = False,
    load: bool = True,
) -> Optional[list[T]]:
    """After this shard's units: every unit's result in order, or None on a shard that does not merge.

    One process: ``own`` (the results it computed or resumed, in unit order); ``own=None``: the
    results live only in the parts, which are read back with ``read`` (e.g. lantern's generate,
    whose tables are those of the parts). Several shards: wait for all of them (a barrier under
    torchrun); a shard that does not merge gets None (rank 0, or ``python -m ambiguity merge``,
    writes the outputs); the merging one reads every unit's part back with ``read``.
    ``every_rank``: every rank of a torchrun group reads them all (each needs the data, e.g. to
    train on it), independent shards get None. ``load``: as in :func:`shard_units`. Raises
    UsageError when a part is missing, damaged or foreign (see :meth:`RunDir.require_parts`).
    """
    if shard.count == 1:
        if own is not None:
            return own
    else:
        shard.barrier()
        if not (shard.group if every_rank else shard.merges):
            return None
    return read_units(run, units, read, load)


# --------------------------------------------------------------------------- the options of a run
@dataclass(frozen=True)
class RunOptions:
    """Where and how a driver keeps its run: the options every command shares (``--out``,
    ``--overwrite``, ``--no-progress``, ``--shard-index/--num-shards`` or torchrun).

    out: the run directory (None: nothing is kept or resumed, where the driver allows that).
    overwrite: clear a stored run first (:meth:`RunDir.open`). progress: show progress bars.
    shard: this process's share of the run (:mod:`ambiguity.distributed`).
    """

    out: Optional[str | Path] = None
    overwrite: bool = False
    progress: bool = True
    shard: Shard = SINGLE

    @classmethod
    def of(cls, options: RunOptions | str | Path | None = None, /) -> RunOptions:
        """A driver's ``options`` argument as RunOptions: RunOptions as it is, a run directory
        (``out``, the other fields at their defaults) or None (all defaults)."""
        if isinstance(options, RunOptions):
            return options
        return cls() if options is None else cls(out=options)

    @classmethod
    def from_args(cls, args, shard: Shard = SINGLE, out: str | Path | None = None) -> RunOptions:
        """The options parsed by :func:`ambiguity.cli.add_run_args` (``out``: the resolved
        ``--out``, default ``args.out``) and this process's ``shard``."""
        return cls(
            out=out if out is not None else getattr(args, "out", None),
            overwrite=bool(getattr(args, "overwrite", False)),
            progress=not getattr(args, "no_progress", False),
            shard=shard,
        )
