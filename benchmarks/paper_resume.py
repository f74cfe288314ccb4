"""Start-to-first-new-work time of a resumed ``python -m lantern.paper`` run.

    python benchmarks/paper_resume.py --out runs/paper/quick -- --quick   # the run's own options after --

Runs the paper command in this process and stops it at its first new work (a session's first
timed round or untimed decode: its rounds are ones no part holds yet), printing the seconds since
the interpreter started (imports, model loading and the reading of finished parts included), when
each item starts, and which work came first. Interrupt a run (e.g. kill it during a session), then
run this with the same arguments; ``PAPER_RESUME_PROFILE=FILE`` also writes cProfile statistics.
The stopped process writes nothing beyond what the command writes before its first new work; a
finished run prints "finished without new work" (its report is rewritten).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

T0 = time.perf_counter()  # before the heavy imports below
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks.common
PROFILE = os.environ.get("PAPER_RESUME_PROFILE")  # a path: cProfile statistics of the whole start written there
if PROFILE:
    import cProfile

    _profiler = cProfile.Profile()
    _profiler.enable()


def _stop(what: str):
    def wrapper(*args, **kwargs):
        print(f"first new work after {time.perf_counter() - T0:.2f} s: {what}", flush=True)
        if PROFILE:
            _profiler.disable()
            _profiler.dump_stats(PROFILE)
        os._exit(0)

    return wrapper


def main(argv: Optional[list[str]] = None) -> None:
    """Resume the paper run ``--out`` (with its other options after ``--``) up to its first new work."""
    from ambiguity.cli import ArgumentParser
    from benchmarks.common import add_results_arg

    ap = ArgumentParser(prog="python benchmarks/paper_resume.py", description=__doc__.splitlines()[0])
    add_results_arg(ap, "paper_resume", "quick", "the interrupted lantern.paper run directory")
    ap.add_argument("paper_args", nargs="*", help="the run's other lantern.paper options, after --, e.g. -- --quick")
    args = ap.parse_args(argv)
    import lantern.paper.sessions as sessions
    from lantern.paper import experiments
    from lantern.paper.__main__ import main as paper_main

    print(f"imports: {time.perf_counter() - T0:.2f} s", flush=True)
    sessions.interleaved_timing = _stop("a session's timed round")
    sessions.decode = _stop("a session's untimed rounds")
    for name, fn in list(experiments.EXPERIMENTS.items()):

        def entered(ctx, _fn=fn, _name=name):
            print(f"item {_name} starts after {time.perf_counter() - T0:.2f} s", flush=True)
            return _fn(ctx)

        experiments.EXPERIMENTS[name] = entered
    paper_main([*args.paper_args, "--out", args.out])
    print(f"finished without new work after {time.perf_counter() - T0:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
