"""What a row-parallel decoder (:mod:`lantern.methods.spatial.method`: ZipAR, PJD) runs with: the
methods, their official defaults, :class:`SpatialConfig`, the check of a config against a model
(:func:`check_spatial`) and their command-line options (:data:`OPTIONS`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ambiguity.errors import UsageError
from ambiguity.models.base import TokenModel
from lantern.engine.options import OptionGroup

__all__ = [
    "SPATIAL_METHODS",
    "ZIPAR_WINDOW",
    "PJD_WINDOW",
    "PJD_OFFSET",
    "SpatialConfig",
    "check_spatial",
    "OPTIONS",
    "from_args",
]

SPATIAL_METHODS = ("zipar", "pjd")
ZIPAR_WINDOW = 8  # ZipAR's --zipar-window-size default (LlamaGen-ZipAR/autoregressive/sample/sample_c2i_ddp_zipar.py)
PJD_WINDOW = 8  # PJD: tokens per row per forward; not published in what we could read (chosen, docs/decoding.md)
PJD_OFFSET = 8  # PJD: committed tokens of row r before row r + 1 starts; likewise chosen


def _positive(value, flag: str, what: str) -> None:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise UsageError(f"{flag} ({what}) must be an integer >= 1, got {value}")


@dataclass(frozen=True)
class SpatialConfig:
    """A row-parallel method and its knobs.

    method: ``"zipar"`` or ``"pjd"``. ZipAR: window: the local window ``s`` (row ``r + 1`` starts
    once row ``r`` has ``s`` committed tokens; with ``adaptive`` the minimum window ``s_min``);
    adaptive: the paper's adaptive window (the first token of a new row is a draft, re-judged by
    rejection sampling each forward until accepted). PJD: rows: tokens per row per forward ``L``
    (the row's last committed token and ``L - 1`` Jacobi drafts); offset: committed tokens of row
    ``r`` before row ``r + 1`` starts. Raises :class:`UsageError` for a bad value (the grid bounds
    are checked by :func:`check_spatial`).
    """

    method: str = "zipar"
    window: int = ZIPAR_WINDOW
    adaptive: bool = False
    rows: int = PJD_WINDOW
    offset: int = PJD_OFFSET

    def __post_init__(self):
        if self.method not in SPATIAL_METHODS:
            raise UsageError(f"unknown row-parallel method {self.method!r}; use one of {', '.join(SPATIAL_METHODS)}")
        _positive(self.window, "--zipar-window", "tokens of a row before the next row starts")
        _positive(self.rows, "--pjd-window", "tokens per row per forward")
        _positive(self.offset, "--pjd-offset", "tokens of a row before the next row starts")
        if not isinstance(self.adaptive, bool):
            raise UsageError(f"--zipar-mode: adaptive must be True or False, got {self.adaptive!r}")

    @property
    def start_after(self) -> int:
        """Committed tokens of row r that start row r + 1 (ZipAR's window, PJD's offset)."""
        return int(self.window if self.method == "zipar" else self.offset)

    @property
    def draft_depth(self) -> int:
        """Jacobi drafts per row per forward (PJD: L - 1; ZipAR: 0, its adaptive row start aside)."""
        return int(self.rows) - 1 if self.method == "pjd" else 0

    def as_dict(self) -> dict:
        """The knobs that matter for ``method`` (JSON-able)."""
        if self.method == "zipar":
            return {"zipar_window": int(self.window), "zipar_adaptive": bool(self.adaptive)}
        return {"pjd_window": int(self.rows), "pjd_offset": int(self.offset)}

    def replace(self, **kw) -> SpatialConfig:
        return SpatialConfig(**{**asdict(self), **kw})


def check_spatial(config: SpatialConfig, model: TokenModel) -> None:
    """Raise UsageError (one line) when ``model`` cannot run ``config``: no 2-D token grid (a text
    model: rows are what these methods decode in parallel), end-of-row tokens in its layout (cache
    slot = raster position does not hold), a window or offset longer than a row."""
    grid = tuple(getattr(model, "grid", (1, model.num_tokens)))
    if len(grid) != 2 or grid[0] < 2:
        raise UsageError(
            f"--method {config.method} decodes the rows of an image grid in parallel, but {model.name} has no "
            f"2-D token grid; use --method ar, sd or sjd"
        )
    if getattr(model, "eol_id", None) is not None:
        raise UsageError(
            f"{model.name} inserts end-of-row tokens, which --method {config.method} does not model; use --method sjd"
        )
    W = int(grid[1])
    flag, value = ("--zipar-window", config.window) if config.method == "zipar" else ("--pjd-offset", config.offset)
    if value > W:
        raise UsageError(f"{flag} must be <= {W}, the tokens per row of {model.name}; got {value}")
    if config.method == "pjd" and config.rows > W:
        raise UsageError(f"--pjd-window must be <= {W}, the tokens per row of {model.name}; got {config.rows}")


# --------------------------------------------------------------------------- command-line options
def _add_zipar(g) -> None:
    g.add_argument(
        "--zipar-window",
        type=int,
        default=ZIPAR_WINDOW,
        help=f"row r + 1 starts once row r has this many tokens, 1..W (official {ZIPAR_WINDOW}; W is AR)",
    )
    g.add_argument(
        "--zipar-mode",
        default="fixed",
        choices=("fixed", "adaptive"),
        help="fixed window (the official code) or adaptive: --zipar-window is the minimum and a new row's first "
        "token is re-judged by rejection sampling until accepted (the paper; not in the official code)",
    )


def _add_pjd(g) -> None:
    g.add_argument(
        "--pjd-window",
        type=int,
        default=PJD_WINDOW,
        help=f"tokens per row per forward: the row's last token and L - 1 Jacobi drafts, 1..W (default {PJD_WINDOW})",
    )
    g.add_argument(
        "--pjd-offset",
        type=int,
        default=PJD_OFFSET,
        help=f"row r + 1 starts once row r has this many tokens, 1..W (default {PJD_OFFSET}; W decodes row by row)",
    )


OPTIONS = (
    OptionGroup("ZipAR", ("zipar",), _add_zipar),
    OptionGroup("PJD", ("pjd",), _add_pjd),
)


def from_args(args) -> dict:
    """The :class:`SpatialConfig` fields from the parsed :data:`OPTIONS`."""
    return dict(
        window=args.zipar_window, adaptive=args.zipar_mode == "adaptive", rows=args.pjd_window, offset=args.pjd_offset
    )
