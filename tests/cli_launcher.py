"""Run many short commands as forked processes of one warm interpreter (for tests/test_bad_inputs.py).

``python tests/cli_launcher.py`` imports the heavy third-party libraries once (torch, pandas,
...; about 2 s of CPU per start on a 2-core machine), then reads one JSON request a line from
stdin: ``{"argv": [...], "cwd": ..., "env": {...}, "stdout": path, "stderr": path}``. For each it
forks a child that behaves like ``python -m <module> ARGS`` (``argv = ["-m", module, ...]``) or
``python <script> ARGS`` (``argv = [script, ...]``): its own working directory, environment,
stdout and stderr files, ``sys.argv`` and ``__main__``; an exception that escapes is printed
with its traceback by ``sys.excepthook`` and exits 1, as the interpreter does. It answers each
request with ``{"pid": ...}`` at once and ``{"code": exit status}`` once the child has ended.

The package's own modules are not imported ahead (``runpy`` warns on stderr when the module it
runs is already imported), so every command imports them itself, as from a fresh start.
``BAD_INPUTS_FRESH=1`` in the environment of the tests skips this launcher and starts a fresh
interpreter per command instead (slower, the same verdicts).
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys

AS_LIMIT = 12 * 2**30  # address space of a command: a runaway allocation fails there, not on the machine


def _preload() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import safetensors.torch  # noqa: F401
    import scipy.stats  # noqa: F401
    import torch  # noqa: F401
    import tqdm.auto  # noqa: F401
    from PIL import Image  # noqa: F401


def _child(req: dict) -> None:
    """In the forked process: become the command, run it, exit with its status (never returns)."""
    code = 1
    try:
        out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        argv = req["argv"]
        try:
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file name in argv[0]
                sys.path[0] = os.getcwd()  # as python -m does
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def main() -> None:
    _preload()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        print(json.dumps({"pid": pid}), flush=True)  # the caller may kill a command that hangs
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        print(json.dumps({"code": code}), flush=True)


if __name__ == "__main__":
    main()
