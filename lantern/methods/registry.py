"""The one place a decoding method is named: each ``--method`` value, its builder and its options.

A builder takes the checked configuration (:class:`lantern.engine.decode.DecodeConfig`), the
target, the drafter (None for methods without one) and the prepared neighbour table (None where
the rule uses none) and returns the :class:`~lantern.engine.method.Method` the engine runs.
Adding a method is its module plus one line here.
"""

from __future__ import annotations

from lantern.methods import chain, drafting
from lantern.methods.ar import AR
from lantern.methods.chain import Chain
from lantern.methods.jacobi import config as jacobi_config
from lantern.methods.jacobi.method import Jacobi
from lantern.methods.spatial import config as spatial_config
from lantern.methods.spatial.method import RowParallel
from lantern.methods.tree import spec as tree_spec
from lantern.methods.tree.method import Tree

__all__ = ["METHODS", "DRAFTED", "OPTIONS"]


def _drafted(config, model, drafter, table):
    """A drafter method: a draft tree per round when the config has one, else a chain of γ."""
    if config.tree is not None:
        return Tree(config.rule, config.tree, drafter, table)
    return Chain(config.rule, config.gamma, drafter, table)


def _jacobi(config, model, drafter, table):
    return Jacobi(config.jacobi, model)


# --method -> builder(config, model, drafter, table)
METHODS = {
    "ar": lambda config, model, drafter, table: AR(),
    "sd": _drafted,
    "lantern": _drafted,
    "lantern-jsd": _drafted,
    "lantern++": _drafted,
    "sjd": _jacobi,
    "gsd": _jacobi,
    "scd": _jacobi,
    "zipar": lambda config, model, drafter, table: RowParallel(config.spatial, model.grid),
    "pjd": lambda config, model, drafter, table: RowParallel(config.spatial, model.grid),
}
DRAFTED = tuple(m for m, build in METHODS.items() if build is _drafted)  # the methods that need a drafter
# every method's command-line options (lantern.engine.options), in --help order
OPTIONS = (*tree_spec.OPTIONS, *chain.OPTIONS, *drafting.RULE_OPTIONS, *jacobi_config.OPTIONS, *spatial_config.OPTIONS)
