"""The one place a decoding method is named: each ``--method`` value, its plug-in and its options.

A :class:`Plugin` says how the engine gets one ``--method``: ``build(config, model, drafter,
table)`` returns the :class:`~lantern.engine.method.Method` the engine runs, from the checked
configuration (:class:`lantern.engine.decode.DecodeConfig`), the target, the drafter (None for
methods without one) and the prepared neighbour table (None where the rule uses none). A method
with a config of its own (the training-free ones) names its dataclass (``params``), how its
fields come from the parsed options (``from_args``) and what a model must have to run it
(``check``); the drafted methods share the family's config (an acceptance rule of
:data:`lantern.rules.acceptance.BOUNDS`, γ, the draft tree). Adding a method is its module plus
one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Optional

from lantern.engine.policy import CALIBRATED, GammaPolicy, NodePolicy, WindowPolicy, load_predictor, predictor_path
from lantern.methods import chain, drafting
from lantern.methods.ar import AR
from lantern.methods.chain import Chain
from lantern.methods.jacobi import config as jacobi_config
from lantern.methods.jacobi.config import JacobiConfig, check_jacobi
from lantern.methods.jacobi.method import Jacobi
from lantern.methods.sjd_pac import config as pac_config
from lantern.methods.sjd_pac.config import PacConfig, check_pac
from lantern.methods.sjd_pac.config import from_args as pac_from_args
from lantern.methods.sjd_pac.method import SJDPAC
from lantern.methods.spatial import config as spatial_config
from lantern.methods.spatial.config import SpatialConfig, check_spatial
from lantern.methods.spatial.config import from_args as spatial_from_args
from lantern.methods.spatial.method import RowParallel
from lantern.methods.tree import spec as tree_spec
from lantern.methods.tree.method import Tree

__all__ = ["Plugin", "METHODS", "DRAFTED", "OPTIONS"]


@dataclass(frozen=True)
class Plugin:
    """One ``--method``: build: ``(config, model, drafter, table) -> Method``; drafter: whether it
    drafts with an EAGLE drafter (its config is then the family's: rule, γ, tree); params: its own
    config dataclass (keyword fields -> instance, with ``method``, ``draft_depth``, ``as_dict()``), None
    for AR and the drafted family; from_args: ``parsed options -> params' keyword fields``; check:
    ``(params, model) -> None``, UsageError where the model cannot run it."""

    build: Callable
    drafter: bool = False
    params: Optional[Callable] = None
    from_args: Optional[Callable] = None
    check: Optional[Callable] = None


def _drafted(config, model, drafter, table):
    """A drafter method: a draft tree per round when the config has one, else a chain of γ (or of
    the length :class:`lantern.engine.policy.GammaPolicy` picks each round, ``gamma="auto"``)."""
    if config.tree is not None:  # gamma="auto": the node budget of a dynamic tree from the engine's policy
        return Tree(config.rule, config.tree, drafter, table, NodePolicy(config.tree) if config.auto else None)
    if config.auto:  # the engine's draft-length policy, with the acceptance predictor shipped with the drafter
        method = config.rule.method if config.rule.method in CALIBRATED else "lantern"  # others read LANTERN's
        predictor = load_predictor(predictor_path(model.name, method), model.name)
        return Chain(config.rule, config.gamma_max, drafter, table, GammaPolicy(predictor, config.gamma_max))
    return Chain(config.rule, config.gamma, drafter, table)


def _jacobi(method: str) -> Plugin:
    return Plugin(
        lambda config, model, drafter, table: Jacobi(
            config.params, model, policy=WindowPolicy(config.params.window) if config.params.auto else None
        ),
        params=partial(JacobiConfig, method),
        from_args=jacobi_config.from_args,
        check=check_jacobi,
    )


def _row_parallel(method: str) -> Plugin:
    return Plugin(
        lambda config, model, drafter, table: RowParallel(config.params, model.grid),
        params=partial(SpatialConfig, method),
        from_args=spatial_from_args,
        check=check_spatial,
    )


DRAFTED_PLUGIN = Plugin(_drafted, drafter=True, from_args=drafting.rule_from_args)
METHODS = {
    "ar": Plugin(lambda config, model, drafter, table: AR()),
    "sd": DRAFTED_PLUGIN,
    "lantern": DRAFTED_PLUGIN,
    "lantern-jsd": DRAFTED_PLUGIN,
    "lantern++": DRAFTED_PLUGIN,
    "cool-sd": DRAFTED_PLUGIN,
    "fly": DRAFTED_PLUGIN,
    "sjd": _jacobi("sjd"),
    "gsd": _jacobi("gsd"),
    "scd": _jacobi("scd"),
    "entropy-sd": _jacobi("entropy-sd"),
    "sjd-pac": Plugin(
        lambda config, model, drafter, table: SJDPAC(config.params),
        params=PacConfig,
        from_args=pac_from_args,
        check=check_pac,
    ),
    "zipar": _row_parallel("zipar"),
    "pjd": _row_parallel("pjd"),
}
DRAFTED = tuple(m for m, plugin in METHODS.items() if plugin.drafter)  # the methods that need a drafter
# every method's command-line options (lantern.engine.options), in --help order
OPTIONS = (
    *tree_spec.OPTIONS,
    *chain.OPTIONS,
    *drafting.RULE_OPTIONS,
    *jacobi_config.OPTIONS,
    *pac_config.OPTIONS,
    *spatial_config.OPTIONS,
)
