"""``python -m ambiguity merge RUN``: assemble a sharded run's outputs from its parts.

Shards launched as independent processes (``--shard-index i --num-shards n``) each write their
parts into the shared run directory; this command then writes what a single process would have
written (tables, summary, figures). It reads the run's ``run.json``, which names the function that
merges runs of its command (``"module:function"``, e.g. ``ambiguity.profile:merge_run`` or
``lantern.generate:merge_run``), and refuses, with one line, a run whose parts are missing,
damaged or from other settings.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Optional

from ambiguity.cli import ArgumentParser, cli_main
from ambiguity.errors import UsageError
from ambiguity.runs import RUN_FILE, RunDir

__all__ = ["main", "merge"]

PACKAGES = ("ambiguity", "lantern")  # a run.json may only name a merge_run of these packages


def merge(path: str | Path, figures: bool = True):
    """Merge the run directory ``path`` with the function its ``run.json`` names. Raises UsageError
    for a directory that is not a mergeable run."""
    path = Path(path).expanduser()
    if not (path / RUN_FILE).is_file():
        raise UsageError(f"{path} holds no {RUN_FILE}: not a run directory of this toolkit")
    record = RunDir(path, {}, command="merge").stored()
    target = record.get("merge")
    if not target:
        raise UsageError(f"{path} was written by {record.get('command', 'a command')}, whose runs need no merge")
    module, _, func = str(target).partition(":")
    if module.split(".")[0] not in PACKAGES or func != "merge_run":
        raise UsageError(
            f"{path}/{RUN_FILE} names {target!r} as its merge, not a merge of this toolkit "
            f"(<ambiguity|lantern module>:merge_run); the run directory is damaged or foreign"
        )
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError):
        raise UsageError(
            f"{path} is merged by {target}, which this installation lacks; install the package that wrote it"
        ) from None
    return fn(path, figures=figures)


@cli_main
def main(argv: Optional[list[str]] = None) -> int:
    ap = ArgumentParser(prog="python -m ambiguity merge", description=__doc__.splitlines()[0])
    ap.add_argument("run", help="the run directory the shards wrote into (their --out)")
    ap.add_argument("--no-figures", action="store_true", help="write only tables and summary (no model is loaded)")
    args = ap.parse_args(argv)
    merge(args.run, figures=not args.no_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
