"""Command-line plumbing shared by every entry point: argument groups, value parsers, one-line errors.

Every ``python -m ...`` command, benchmark and script builds its parser from these groups, so an
option means the same thing everywhere and bad input always ends the same way: one
``error: ...`` line on stderr that names the fix, exit status 2, no traceback
(:func:`cli_main`, :class:`ArgumentParser`).

Groups (each adds its options to a parser or an argument group):

* :func:`add_model_args` — ``--model --weights --device --dtype``
* :func:`add_sampling_args` — ``--cfg --temperature --top-k --top-p``
* :func:`add_condition_args` — ``--num-images --batch-size --seed --classes --captions``
* :func:`add_run_args` — ``--out --overwrite --no-progress``
* single options used alone: :func:`add_device_args` (``--device --dtype --threads``),
  :func:`add_threads_arg`, :func:`add_data_arg` (``--data``), :func:`add_out_arg` (``--out``),
  :func:`add_guidance_arg` (``--cfg``). One definition per flag; a flag name has one meaning everywhere.

Value parsers (argparse ``type=`` callables) reject what would fail later with a traceback:
non-finite numbers, seeds beyond 63 bits, negative sizes, malformed lists, empty paths.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Optional

import torch

from ambiguity.errors import FieldError, UsageError
from ambiguity.models.base import resolve_device
from ambiguity.models.registry import resolve_dtype
from ambiguity.sampling import SamplingConfig, default_guidance

__all__ = [
    "ArgumentParser",
    "cli_main",
    "add_model_args",
    "add_device_args",
    "set_threads",
    "add_sampling_args",
    "add_condition_args",
    "add_shard_args",
    "add_run_args",
    "add_overwrite_arg",
    "add_progress_arg",
    "add_threads_arg",
    "add_data_arg",
    "add_out_arg",
    "add_guidance_arg",
    "finite_float",
    "path_arg",
    "unit_float",
    "positive_int",
    "nonneg_int",
    "seed_int",
    "int_list",
    "float_list",
    "parse_mapping",
    "sampling_from_args",
    "device_from_args",
    "default_out",
    "FIELD_FLAGS",
    "flag_for",
    "check_out_dir",
    "check_out_file",
    "shown_path",
    "print_written",
    "safe_name",
    "run_subcommand",
    "MAX_SEED",
    "DEVICES",
]

MAX_SEED = 2**63 - 1
DEVICES = ("auto", "cpu", "cuda", "cuda:N")


# --------------------------------------------------------------------------- errors and the parser
def cli_main(fn: Callable[..., int | None]) -> Callable[..., int]:
    """Decorate a ``main(argv=None)`` so that it always returns an exit status.

    UsageError -> one line ``error: ...`` on stderr and 2; argparse's own exits (``--help``: 0,
    a malformed option: 2, already printed on one line) are returned instead of raised;
    KeyboardInterrupt -> 130 with a one-line note (results already written stay on disk); out
    of memory (MemoryError, torch's allocator errors) or a full disk -> 2 with one line. Warnings
    show as one ``note:`` line each. Programming errors still raise.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> int:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_as_note
            return _run(fn, *args, **kwargs)

    return wrapper


def _warning_as_note(message, category, filename, lineno, file=None, line=None) -> None:
    """Show a warning as one ``note:`` line on stderr (no source line, no location)."""
    text = str(message).strip().splitlines()
    print(f"note: {text[0] if text else category.__name__}", file=sys.stderr)


def _run(fn: Callable[..., int | None], *args, **kwargs) -> int:
    """``fn``'s exit status, with the conversions of :func:`cli_main`."""
    try:
        return int(fn(*args, **kwargs) or 0)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except FieldError as exc:
        print(f"error: {exc.as_flag(flag_for(exc.owner, exc.field))}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished results are on disk; rerun the same command to resume", file=sys.stderr)
        return 130
    except MemoryError:
        print(f"error: {OUT_OF_MEMORY}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # torch's allocators raise RuntimeError (CUDA: torch.OutOfMemoryError)
        if not _out_of_memory(exc):
            raise
        print(f"error: {OUT_OF_MEMORY} ({_last_line(exc)})", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno == 28:  # ENOSPC
            print(
                f"error: no space left on the device ({exc.filename or 'output'}); free space or pass another --out",
                file=sys.stderr,
            )
            return 2
        raise


#: (settings class, field) -> its command-line flag, where that is not ``--`` + the field with dashes
FIELD_FLAGS = {
    ("SamplingConfig", "guidance"): "--cfg",
    ("TreeSpec", "top_k"): "--tree-top-k",
    ("CompareSettings", "n_boot"): "--bootstrap",
}


def flag_for(owner: str, field: str) -> str:
    """The flag that sets ``owner.field`` (:data:`FIELD_FLAGS`, else ``--field-name``)."""
    return FIELD_FLAGS.get((owner, field), "--" + field.replace("_", "-"))


OUT_OF_MEMORY = "out of memory; lower --num-images / --batch-size (or the sizes of the run)"


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocator's out-of-memory error (CPU or CUDA)."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    text = str(exc)
    return isinstance(exc, oom) or "can't allocate memory" in text or "out of memory" in text.lower()


def _last_line(exc: BaseException, width: int = 120) -> str:
    """The last line of ``exc``'s message (where allocators put the size), at most ``width`` characters."""
    text = str(exc).strip().splitlines()
    line = text[-1] if text else type(exc).__name__
    return line if len(line) <= width else line[: width - 3] + "..."


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (``error: ... (see <prog> --help)``) and exit status 2."""

    def error(self, message: str):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


# --------------------------------------------------------------------------- value parsers
def _type(name: str, fn: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse ``type=`` whose failures read as one line (argparse prints ``argument --x: ...``)."""

    def parse(text: str):
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def _finite(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"expected a finite number, got {text!r}")
    return x


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def _positive(text: str) -> int:
    v = _int(text)
    if v < 1:
        raise ValueError(f"must be >= 1, got {v}")
    return v


def _nonneg(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise ValueError(f"must be >= 0, got {v}")
    return v


def _seed(text: str) -> int:
    v = _int(text)
    if not 0 <= v <= MAX_SEED:
        raise ValueError(f"seeds must be in 0..2**63-1, got {text}")
    return v


def _unit(text: str) -> float:
    x = _finite(text)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"must be in [0, 1], got {text}")
    return x


def _path(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a path, got an empty string")
    return text


finite_float = _type("number", _finite)
path_arg = _type("path", _path)
unit_float = _type("probability", _unit)
positive_int = _type("positive integer", _positive)
nonneg_int = _type("integer >= 0", _nonneg)
seed_int = _type("seed", _seed)


def int_list(
    text: str | Sequence[int], what: str = "the list", minimum: Optional[int] = None, maximum: Optional[int] = None
) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4] (a sequence of ints passes through). Raises UsageError naming ``what``
    for non-integers, an empty list or values outside [minimum, maximum]."""
    out = _split_list(text, int, what, "integers like 1,4,16") if isinstance(text, str) else [int(v) for v in text]
    if not out:
        raise UsageError(f"{what} is empty; give comma-separated integers like 1,4,16")
    bad = _outside(out, minimum, maximum)
    if bad:
        lo = "" if minimum is None else f">= {minimum}"
        hi = "" if maximum is None else f"<= {maximum}"
        raise UsageError(f"{what} values must be {' and '.join(x for x in (lo, hi) if x)}, got {bad[0]}")
    return out


def float_list(
    text: str | Sequence[float],
    what: str = "the list",
    minimum: Optional[float] = None,
    maximum: Optional[float] = None,
) -> list[float]:
    """``"0.1,0.5"`` -> [0.1, 0.5]; finite values only. Raises UsageError as :func:`int_list`."""
    if isinstance(text, str):
        out = _split_list(text, _finite, what, "finite numbers like 0.1,0.5")
    else:
        out = [float(v) for v in text]
        if not all(math.isfinite(v) for v in out):
            raise UsageError(f"{what} must hold finite numbers, got {out}")
    if not out:
        raise UsageError(f"{what} is empty; give comma-separated numbers like 0.1,0.5")
    bad = _outside(out, minimum, maximum)
    if bad:
        raise UsageError(f"{what} values must lie in [{minimum}, {maximum}], got {bad[0]:g}")
    return out


def _split_list(text: str, parse: Callable[[str], float], what: str, kind: str) -> list:
    """Comma-separated ``text`` (spaces ignored) parsed item by item; a ValueError of ``parse``
    becomes UsageError naming ``what`` and the expected ``kind`` (e.g. "integers like 1,4,16")."""
    try:
        return [parse(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated {kind}, got {text!r}") from None


def _outside(values: list, minimum: Optional[float], maximum: Optional[float]) -> list:
    """The values below ``minimum`` or above ``maximum`` (a None bound: no bound), in order."""
    return [v for v in values if (minimum is not None and v < minimum) or (maximum is not None and v > maximum)]


def parse_mapping(
    items: Optional[Sequence[str]], names: Sequence[str], flag: str = "--weights", must_exist: bool = True
) -> dict[str, Path]:
    """``["anole=/ckpt/anole", ...]`` (comma-separated or repeated) -> {name: path}.

    Raises UsageError for an item without ``=``, a name not in ``names`` or a path that does not
    exist (when ``must_exist``).
    """
    out: dict[str, Path] = {}
    for item in items or []:
        for part in [p for p in str(item).split(",") if p.strip()]:
            name, sep, path = part.partition("=")
            name, path = name.strip(), path.strip()
            if not sep or not name or not path:
                raise UsageError(f"{flag} takes MODEL=PATH (e.g. {flag} anole=/ckpt/Anole-7b), got {part!r}")
            if name not in names:
                raise UsageError(
                    f"{flag} names {name!r}, which is not in --models ({','.join(names)}); "
                    f"add it to --models or fix the name"
                )
            p = Path(path).expanduser()
            if must_exist and not p.exists():
                raise UsageError(f"{flag} path for {name} does not exist: {p}; check the path")
            out[name] = p
    return out


# --------------------------------------------------------------------------- argument groups
def add_model_args(p, default: str = "embedded", dtype: bool = True, image_size: bool = False) -> None:
    """``--model --weights --device [--dtype] [--image-size]`` (``image_size``: for commands that pass
    it on to :func:`ambiguity.models.registry.load_model`)."""
    p.add_argument("--model", default=default, metavar="NAME", help=f"registry name or hf:<repo> (default: {default})")
    p.add_argument(
        "--weights",
        type=path_arg,
        default=None,
        metavar="PATH",
        help="checkpoint file or directory (default: shipped files / local Hugging Face cache)",
    )
    if image_size:
        p.add_argument(
            "--image-size",
            type=positive_int,
            default=None,
            metavar="PX",
            help="the image size a LlamaGen checkpoint was trained at (its file does not record its token "
            "grid; default: from the file name, else the model name's size)",
        )
    add_device_args(p, dtype=dtype)


def add_device_args(p, dtype: bool = True, threads: Optional[int] = None, what: str = "") -> None:
    """``--device [--dtype] [--threads]`` (``threads``: the default CPU thread count; None: no option;
    ``what``: what runs on the device, for the help text)."""
    p.add_argument(
        "--device",
        default="auto",
        metavar="DEVICE",
        help=f"auto | cpu | cuda | cuda:N{', ' + what if what else ''} (default: auto)",
    )
    if dtype:
        p.add_argument(
            "--dtype",
            default=None,
            metavar="DTYPE",
            help="auto | float32 | float64 | bfloat16 | float16 (default: fp32 on CPU, bf16 on CUDA; float64: "
            "batched decoding gives exactly batch 1's tokens)",
        )
    if threads is not None:
        add_threads_arg(p, threads)


def add_threads_arg(p, default: int = 0) -> None:
    """``--threads N``: CPU threads for torch (and faiss), 0 = torch's default; apply with :func:`set_threads`."""
    p.add_argument(
        "--threads",
        type=nonneg_int,
        default=default,
        metavar="N",
        help=f"CPU threads for torch, 0 = torch's default (default: {default})",
    )


def add_data_arg(p, help: str = "Fashion-MNIST IDX directory (default: the usual places)") -> None:
    """``--data DIR``: where the Fashion-MNIST IDX files are (None: :mod:`ambiguity.data.fashion_mnist` searches)."""
    p.add_argument("--data", type=path_arg, default=None, metavar="DIR", help=help)


def add_out_arg(p, help: str, default: Optional[str] = None, metavar: str = "DIR") -> None:
    """``--out``: where a command writes (a run directory, or a file where ``metavar`` says so)."""
    p.add_argument("--out", type=path_arg, default=default, metavar=metavar, help=help)


def set_threads(n: int) -> None:
    """``torch.set_num_threads(n)`` (and faiss's OpenMP threads) unless ``n`` is 0."""
    if n:
        torch.set_num_threads(int(n))
        try:
            import faiss

            faiss.omp_set_num_threads(int(n))
        except (ImportError, AttributeError):  # faiss without OpenMP controls
            pass


def add_sampling_args(p, guidance: Optional[float] = None, guidance_help: Optional[str] = None) -> None:
    """``--cfg --temperature --top-k --top-p``; ``guidance`` is the default scale (None: by the model's kind)."""
    add_guidance_arg(p, guidance, guidance_help)
    p.add_argument(
        "--temperature",
        type=finite_float,
        default=1.0,
        metavar="T",
        help="sampling temperature, 0 = greedy (default: 1.0)",
    )
    p.add_argument(
        "--top-k", type=nonneg_int, default=0, metavar="K", help="keep the k most likely tokens, 0 = all (default: 0)"
    )
    p.add_argument(
        "--top-p", type=finite_float, default=1.0, metavar="P", help="nucleus mass in (0, 1], 1 = all (default: 1.0)"
    )


def add_guidance_arg(p, guidance: Optional[float] = None, guidance_help: Optional[str] = None) -> None:
    """``--cfg S``: the classifier-free guidance scale (``guidance`` in code; None: by the model's kind)."""
    default = "4.0 c2i, 7.5 t2i, 1.0 text" if guidance is None else f"{guidance:g}"
    p.add_argument(
        "--cfg",
        type=finite_float,
        default=guidance,
        metavar="S",
        help=guidance_help or f"classifier-free guidance scale s, 1 = none (default: {default})",
    )


def add_condition_args(
    p,
    num_images: int = 64,
    batch_size: Optional[int] = 32,
    classes: bool = True,
    captions: bool = True,
    seed_help: str = "image i draws from its own stream seeded by (seed, i) (default: 0)",
) -> None:
    """``--num-images [--batch-size] --seed [--classes] [--captions]``."""
    p.add_argument(
        "--num-images",
        type=positive_int,
        default=num_images,
        metavar="N",
        help=f"images to generate or analyse (default: {num_images})",
    )
    if batch_size is not None:
        p.add_argument(
            "--batch-size",
            type=positive_int,
            default=batch_size,
            metavar="B",
            help=f"images per forward pass and per resumable part (default: {batch_size})",
        )
    p.add_argument("--seed", type=seed_int, default=0, metavar="S", help=seed_help)
    if classes:
        p.add_argument(
            "--classes", default=None, metavar="LIST", help="class labels for c2i models, e.g. 0,3,7 (cycled)"
        )
    if captions:
        p.add_argument(
            "--captions",
            type=path_arg,
            default=None,
            metavar="FILE",
            help="t2i captions: a text file (one per line) or an MS-COCO captions_*.json",
        )


def add_shard_args(p) -> None:
    """``--shard-index --num-shards`` (independent processes; torchrun needs neither, see
    :mod:`ambiguity.distributed`)."""
    p.add_argument(
        "--shard-index",
        type=nonneg_int,
        default=None,
        metavar="I",
        help="this process's shard, 0..n-1, when shards run as independent processes (then merge with "
        "python -m ambiguity merge OUT); torchrun sets the shards itself",
    )
    p.add_argument("--num-shards", type=positive_int, default=None, metavar="N", help="number of independent shards")


def add_run_args(p, out_help: str, overwrite: bool = True) -> None:
    """``--out [--overwrite] --no-progress`` (:meth:`ambiguity.runs.RunOptions.from_args` reads them)."""
    add_out_arg(p, out_help)
    if overwrite:
        add_overwrite_arg(p)
    add_progress_arg(p)


def add_overwrite_arg(p, where: str = "--out") -> None:
    """``--overwrite``: discard a stored run of other settings in ``where`` instead of refusing."""
    p.add_argument("--overwrite", action="store_true", help=f"discard results of a run with other settings in {where}")


def add_progress_arg(p) -> None:
    """``--no-progress``: hide progress bars."""
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


# --------------------------------------------------------------------------- resolving parsed options
def sampling_from_args(args, kind: str = "c2i"):
    """:class:`ambiguity.sampling.SamplingConfig` from ``--cfg --temperature --top-k --top-p``;
    ``--cfg`` absent -> :func:`ambiguity.sampling.default_guidance` of ``kind``. Text models
    always sample without guidance. Raises UsageError for out-of-range values."""
    scale = default_guidance(kind) if getattr(args, "cfg", None) is None else args.cfg
    if kind == "text":
        scale = 1.0
    return SamplingConfig(guidance=scale, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)


def device_from_args(args):
    """(torch.device, torch.dtype) from ``--device`` and ``--dtype`` (UsageError for bad values)."""
    device = resolve_device(getattr(args, "device", "auto"))
    return device, resolve_dtype(getattr(args, "dtype", None), device)


def safe_name(text: str) -> str:
    """A file-system-safe version of a model name (``hf:org/repo`` -> ``hf_org_repo``)."""
    return re.sub(r"[^\w.-]+", "_", str(text))


def default_out(*parts: str) -> Path:
    """``runs/<part>/<part>...`` with each part made file-system safe."""
    return Path("runs", *[safe_name(p) for p in parts])


def check_out_dir(out: str | Path, flag: str = "--out") -> Path:
    """Check that ``out`` can be created or written, without creating anything.

    Raises UsageError (one line naming ``flag``) when ``out`` is a file, lies below a file, or its
    nearest existing ancestor is not a writable directory.
    """
    if not str(out):
        raise UsageError(f"{flag} is empty; pass a directory path")
    out = Path(out).expanduser().absolute()
    try:
        if out.exists() and not out.is_dir():
            raise UsageError(f"{flag} {out} is a file; pass a directory")
        anc = out
        while not anc.exists():
            anc = anc.parent
    except OSError as exc:  # a name too long for the file system, a loop of links, ...
        raise UsageError(
            f"{flag} {_short(out)} is not a usable path ({exc.strerror or exc}); pass another {flag}"
        ) from None
    if not anc.is_dir():
        raise UsageError(f"{flag} {out} lies below the file {anc}; pass a directory path")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write to {out} ({anc} is not a writable directory); pass a writable {flag}")
    return out


def shown_path(path: str | Path) -> str:
    """How every command prints a path it wrote or read: relative to the working directory when it
    lies below it (``runs/x/summary.json``), else absolute (``/data/runs/x``); ``~`` is expanded."""
    p = Path(os.path.abspath(Path(path).expanduser()))
    try:
        return str(p.relative_to(os.getcwd()))
    except ValueError:
        return str(p)


def print_written(paths: Sequence[str | Path], detail: str = "") -> None:
    """Print the ``wrote a, b, c`` line of a command on stdout, each path by :func:`shown_path`,
    then ``detail`` (e.g. ``"; figures in ..."``)."""
    print("wrote " + ", ".join(shown_path(p) for p in paths) + detail)


def _short(path: Path, width: int = 100) -> str:
    text = str(path)
    return text if len(text) <= width else f"{text[: width // 2]}...{text[-width // 2 :]}"


def check_out_file(path: str | Path, flag: str = "--out") -> Path:
    """Check that the file ``path`` can be written (its directory created), without creating anything.

    Raises UsageError (one line naming ``flag``) when ``path`` is a directory, its directory is a
    file or lies below one, or cannot be written.
    """
    if not str(path):
        raise UsageError(f"{flag} is empty; pass a file path")
    path = Path(path).expanduser().absolute()
    try:
        below_file = path.parent.exists() and not path.parent.is_dir()
    except OSError:
        below_file = False  # check_out_dir names the problem
    if below_file:
        raise UsageError(f"{flag} {path} lies below the file {path.parent}; pass a path in a directory")
    check_out_dir(path.parent, flag)
    try:
        if path.is_dir():
            raise UsageError(f"{flag} {path} is a directory; pass a file path")
        os.stat(path.parent / (path.name or "x"))  # a name too long for the file system fails here
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise UsageError(
            f"{flag} {_short(path)} is not a usable path ({exc.strerror or exc}); pass another {flag}"
        ) from None
    return path


def run_subcommand(
    prog: str, commands: Mapping[str, tuple[str, str]], argv: Optional[Sequence[str]] = None, required: bool = False
) -> int:
    """``python -m <package> [command] [options]``: list ``commands`` or run one.

    commands: name -> (module with ``main(argv)``, one-line description). ``--help`` prints the
    list and returns 0; so does no command at all, unless ``required`` (then one ``error:`` line
    and 2); an unknown command returns 2 with one line.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv and required:
        print(f"error: name a command: {', '.join(commands)} (see {prog} --help)", file=sys.stderr)
        return 2
    if not argv or argv[0] in ("-h", "--help", "help"):
        width = max(len(c) for c in commands)
        print(f"usage: {prog} COMMAND [options]   (or python -m <module> [options])\n\ncommands:")
        for name, (module, text) in commands.items():
            print(f"  {name:<{width}}  {text}  [python -m {module.removesuffix('.__main__')}]")
        print(f"\nRun `{prog} COMMAND --help` for the options of one command.")
        return 0
    name = argv[0]
    if name not in commands:
        import difflib

        close = difflib.get_close_matches(name, list(commands), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        print(f"error: unknown command {name!r}; {hint}choose one of {', '.join(commands)}", file=sys.stderr)
        return 2
    return int(importlib.import_module(commands[name][0]).main(argv[1:]) or 0)
