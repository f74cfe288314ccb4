"""What a Jacobi decoder (:mod:`lantern.methods.jacobi.method`: SJD, GSD, SCD, entropy-aware SJD) runs
with: the methods, the initialisations and couplings, the official default windows, :class:`JacobiConfig`,
the check of a config against a model (:func:`check_jacobi`) and their command-line options (:data:`OPTIONS`).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Optional

from ambiguity.cli import finite_float
from ambiguity.errors import UsageError
from ambiguity.models.base import TokenModel
from lantern.engine.options import OptionGroup

__all__ = [
    "JACOBI_METHODS",
    "INITS",
    "COUPLINGS",
    "DEFAULT_WINDOW",
    "JacobiConfig",
    "check_jacobi",
    "OPTIONS",
    "from_args",
]

JACOBI_METHODS = ("sjd", "gsd", "scd", "entropy-sd")
INITS = ("random", "repeat-horizon")
COUPLINGS = ("gumbel", "maximal", "maximal-official")
# test_lumina_mgpt.py / test_GSD.py / test_SCD_*.py; entropy-sd's is its longest window (ours, JacobiConfig)
DEFAULT_WINDOW = {"sjd": 16, "gsd": 16, "scd": 32, "entropy-sd": 24}


@dataclass(frozen=True)
class JacobiConfig:
    """A Jacobi method and its knobs (defaults: the official scripts for Lumina-mGPT).

    method: ``"sjd"``, ``"gsd"``, ``"scd"`` or ``"entropy-sd"``; window: tokens per forward L >= 1 (None: 16
    for SJD and GSD, 32 for SCD, 24 for entropy-sd, where it is the longest window); init: ``"random"`` or
    ``"repeat-horizon"``; group: GSD's rank window
    (1 .. V; 1 = SJD); prob_gap: GSD's probability filter in (0, 1]; distance: GSD's optional
    squared-L2 embedding filter (>= 0, None = off); coupling: SCD's ``"gumbel"``, ``"maximal"`` or
    ``"maximal-official"``; entropy_alpha (nats, > 0) and entropy_floor (in (0, 1]): the
    entropy-aware rule's threshold ``tau(H) = max(floor, exp(-H / alpha))``
    (:func:`lantern.rules.jacobi.entropy_threshold`; alpha = 3 nats is the official code's entropy
    scale of its dynamic temperature ``2.5 exp(-H/3) + 0.6``, krennic999/ARsample
    ``LlamaGen/autoregressive/models/generate.py``; the floor 0.7 is ours, set so that forwards fall
    by about the paper's 15 % against SJD on ``embedded`` (26.7 -> 22.5 per image, 32 images, CFG 3,
    top-k 125): the official release has no speculative-decoding code). entropy_min_window (an
    integer >= 1) and entropy_window_scale (nats, > 0): the entropy-dependent window of each image's
    next forward, ``L(H) = clamp(round(L exp(-H / scale)), min(entropy_min_window, L), L)`` of the
    entropy H of the target distribution its newest token was drawn from
    (:func:`lantern.rules.jacobi.entropy_window`); ``entropy_min_window >= L`` fixes the window at L.
    Our reconstruction (the paper's draft length is not released); L = 24, 4 and 6 nats are ours, set
    on ``embedded`` (128 images, CFG 3, top-k 125, ``benchmarks/bench_entropy_window.py``) so that
    forwards fall by about the paper's 15 % against SJD at its window 16 (26.7 -> 22.9 per image,
    the prefill counted) while the tokens fed per image fall by 13 % (376 -> 328). Raises
    :class:`UsageError` for a bad value (the vocabulary bound of ``group`` is checked by
    :func:`check_jacobi`). auto: the engine picks each forward's window in ``1..window``
    (:class:`lantern.engine.policy.WindowPolicy`, ``--window auto``; ``window`` is then the longest,
    ``--window-max``); entropy-sd's per-image windows are capped by it.
    """

    method: str = "sjd"
    window: Optional[int] = None
    init: str = "random"
    group: int = 14
    prob_gap: float = 0.15
    distance: Optional[float] = None
    coupling: str = "gumbel"
    entropy_alpha: float = 3.0
    entropy_floor: float = 0.7
    entropy_min_window: int = 4
    entropy_window_scale: float = 6.0
    auto: bool = False

    def __post_init__(self):
        if self.method not in JACOBI_METHODS:
            raise UsageError(f"unknown Jacobi method {self.method!r}; use one of {', '.join(JACOBI_METHODS)}")
        if self.window is None:
            object.__setattr__(self, "window", DEFAULT_WINDOW[self.method])
        if isinstance(self.window, bool) or int(self.window) != self.window or self.window < 1:
            raise UsageError(f"--window (tokens per Jacobi forward) must be an integer >= 1, got {self.window}")
        if self.init not in INITS:
            raise UsageError(f"--jacobi-init must be one of {', '.join(INITS)}, got {self.init!r}")
        if isinstance(self.group, bool) or int(self.group) != self.group or self.group < 1:
            raise UsageError(f"--gsd-group (ranks in a GSD group) must be an integer >= 1, got {self.group}")
        if not 0.0 < float(self.prob_gap) <= 1.0:
            raise UsageError(f"--gsd-prob-gap must be in (0, 1], got {self.prob_gap}")
        if self.distance is not None and not float(self.distance) >= 0.0:
            raise UsageError(f"--gsd-distance must be >= 0 (squared L2), got {self.distance}")
        if self.coupling not in COUPLINGS:
            raise UsageError(f"--scd-coupling must be one of {', '.join(COUPLINGS)}, got {self.coupling!r}")
        if not float(self.entropy_alpha) > 0.0:
            raise UsageError(f"--entropy-alpha (nats) must be > 0, got {self.entropy_alpha}")
        if not 0.0 < float(self.entropy_floor) <= 1.0:
            raise UsageError(f"--entropy-floor must be in (0, 1] (1 is SJD), got {self.entropy_floor}")
        m = self.entropy_min_window
        if isinstance(m, bool) or int(m) != m or m < 1:
            raise UsageError(f"--entropy-min-window must be an integer >= 1 (tokens per forward), got {m}")
        if not 0.0 < float(self.entropy_window_scale) < float("inf"):
            raise UsageError(f"--entropy-window-scale (nats) must be > 0, got {self.entropy_window_scale}")

    @property
    def entropy_dynamic(self) -> bool:
        """entropy-sd with an entropy-dependent window (its shortest window below L)."""
        return self.method == "entropy-sd" and int(self.entropy_min_window) < int(self.window)

    @property
    def draft_depth(self) -> int:
        """The longest accepted run of one forward: the window's L - 1 drafts."""
        return int(self.window) - 1

    def as_dict(self) -> dict:
        """The knobs that matter for ``method`` (JSON-able), prefixed ``jacobi_``."""
        d = {"jacobi_window": int(self.window), "jacobi_init": self.init}
        if self.auto:
            d["jacobi_window_auto"] = True
        if self.method == "gsd":
            d.update(gsd_group=int(self.group), gsd_prob_gap=float(self.prob_gap), gsd_distance=self.distance)
        if self.method == "scd":
            d.update(scd_coupling=self.coupling)
        if self.method == "entropy-sd":
            d.update(entropy_alpha=float(self.entropy_alpha), entropy_floor=float(self.entropy_floor))
            d.update(
                entropy_min_window=int(self.entropy_min_window), entropy_window_scale=float(self.entropy_window_scale)
            )
        return d

    def replace(self, **kw) -> JacobiConfig:
        return JacobiConfig(**{**asdict(self), **kw})


def check_jacobi(config: JacobiConfig, model: TokenModel) -> None:
    """Raise UsageError when ``model`` cannot run ``config``: a window longer than the tokens per
    image (``model.num_tokens``: the decoder shrinks the window to the tokens left, so a longer one
    means nothing), a GSD group larger than the vocabulary,
    ``--gsd-distance`` without input embeddings, ``repeat-horizon`` without a 2-D grid."""
    if config.window > model.num_tokens:
        raise UsageError(
            f"--window must be <= {model.num_tokens}, the tokens per image of {model.name}; got {config.window}"
        )
    V = model.vocab_size
    if config.method == "gsd" and config.group > V:
        raise UsageError(
            f"--gsd-group {config.group} exceeds the vocabulary size {V} of {model.name}; use --gsd-group {V} or less"
        )
    if config.method == "gsd" and config.distance is not None:
        try:
            model.input_embeddings()
        except NotImplementedError:
            raise UsageError(
                f"--gsd-distance needs the input embeddings of {model.name}, which it does not expose; "
                f"drop --gsd-distance"
            ) from None
    grid = tuple(getattr(model, "grid", (1, model.num_tokens)))
    if config.init == "repeat-horizon" and (len(grid) != 2 or min(grid) < 2):
        raise UsageError(
            f"--jacobi-init repeat-horizon copies the token to the left in the image grid, but "
            f"{model.name} has no 2-D token grid; use --jacobi-init random"
        )


# --------------------------------------------------------------------------- command-line options
_J = JacobiConfig()


def _window(text: str):
    """``--window``: an integer (checked by the method's config) or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 or auto, got {text!r}") from None


def _add_window(g) -> None:
    g.add_argument(
        "--window",
        type=_window,
        default=None,
        help="tokens per Jacobi forward, 1 <= L <= tokens per image (official 16 for sjd, gsd; 32 for scd; "
        "64 for sjd-pac; entropy-sd: the longest window, default 24, ours), or auto (sjd, gsd, scd, entropy-sd): "
        "the engine picks each forward's window in 1..--window-max from a measured cost model and the "
        "acceptance it has seen (lantern.engine.policy.WindowPolicy; 1 = AR's step)",
    )


def _add_window_max(g) -> None:
    g.add_argument(
        "--window-max",
        type=int,
        default=None,
        help="the longest window --window auto reads (default: the method's window above)",
    )


def _not_auto(args) -> Optional[str]:
    return None if args.window == "auto" else "without --window auto"


def _add_init(g) -> None:
    g.add_argument(
        "--jacobi-init", default=_J.init, choices=INITS, help="new window positions (official: random for Lumina-mGPT)"
    )


def _add_gsd(g) -> None:
    g.add_argument("--gsd-group", type=int, default=_J.group, help=f"ranks in a group, 1..V (official {_J.group})")
    g.add_argument(
        "--gsd-prob-gap",
        type=finite_float,
        default=_J.prob_gap,
        help=f"keep group members with |p(y) - p(x)| below this (official {_J.prob_gap:g})",
    )
    g.add_argument(
        "--gsd-distance",
        type=finite_float,
        default=None,
        help="also a squared-L2 input-embedding bound (official 0.5 on Chameleon; default off)",
    )


def _add_scd(g) -> None:
    g.add_argument(
        "--scd-coupling",
        default=_J.coupling,
        choices=COUPLINGS,
        help="gumbel or maximal coupling of successive drafts (maximal-official: the official "
        "bookkeeping, not lossless) (default: gumbel)",
    )


def _add_entropy(g) -> None:
    g.add_argument(
        "--entropy-alpha",
        type=finite_float,
        default=_J.entropy_alpha,
        help=f"α > 0 nats: the acceptance threshold τ(H) = max(floor, exp(-H / α)) (default {_J.entropy_alpha:g}: "
        "the entropy scale of the official dynamic temperature)",
    )
    g.add_argument(
        "--entropy-floor",
        type=finite_float,
        default=_J.entropy_floor,
        help=f"the threshold's floor in (0, 1]; 1 is SJD (default {_J.entropy_floor:g})",
    )
    g.add_argument(
        "--entropy-min-window",
        type=int,
        default=_J.entropy_min_window,
        help="the shortest window (>= 1 tokens) of the entropy-dependent window L(H) = clamp(round(L exp(-H / "
        f"scale)), this, L), L = --window; >= L fixes the window (default {_J.entropy_min_window}, ours)",
    )
    g.add_argument(
        "--entropy-window-scale",
        type=finite_float,
        default=_J.entropy_window_scale,
        help="scale > 0 nats: the window shrinks by a factor e every scale nats of entropy "
        f"(default {_J.entropy_window_scale:g}, ours)",
    )


OPTIONS = (
    OptionGroup("Jacobi window", (*JACOBI_METHODS, "sjd-pac"), _add_window),
    OptionGroup("Jacobi window policy", JACOBI_METHODS, _add_window_max, _not_auto),
    OptionGroup("Jacobi initialisation", JACOBI_METHODS, _add_init),
    OptionGroup("GSD groups", ("gsd",), _add_gsd),
    OptionGroup("SCD coupling", ("scd",), _add_scd),
    OptionGroup("entropy-aware acceptance", ("entropy-sd",), _add_entropy),
)


def from_args(args) -> dict:
    """The :class:`JacobiConfig` fields from the parsed :data:`OPTIONS`."""
    auto = args.window == "auto"
    return dict(
        window=args.window_max if auto else args.window,
        auto=auto,
        init=args.jacobi_init,
        group=args.gsd_group,
        prob_gap=args.gsd_prob_gap,
        distance=args.gsd_distance,
        coupling=args.scd_coupling,
        entropy_alpha=args.entropy_alpha,
        entropy_floor=args.entropy_floor,
        entropy_min_window=args.entropy_min_window,
        entropy_window_scale=args.entropy_window_scale,
    )
