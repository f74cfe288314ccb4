"""The one place a decoding method is named: each ``--method`` value and how its plug-in is built.

A builder takes the checked configuration (:class:`lantern.engine.decode.DecodeConfig`), the
target, the drafter (None for methods without one) and the prepared neighbour table (None where
the rule uses none) and returns the :class:`~lantern.engine.method.Method` the engine runs.
Adding a method is its module plus one line here.
"""

from __future__ import annotations

from lantern.engine.policy import GammaPolicy, load_predictor, predictor_path
from lantern.methods.ar import AR
from lantern.methods.chain import Chain
from lantern.methods.jacobi.method import Jacobi
from lantern.methods.tree.method import Tree

__all__ = ["METHODS", "DRAFTED"]


def _drafted(config, model, drafter, table):
    """A drafter method: a draft tree per round when the config has one, else a chain of γ (or of
    the length :class:`lantern.engine.policy.GammaPolicy` picks each round, ``gamma="auto"``)."""
    if config.tree is not None:
        return Tree(config.rule, config.tree, drafter, table)
    if config.auto:  # the engine's draft-length policy, with the acceptance predictor shipped with the drafter
        predictor = load_predictor(predictor_path(model.name), model.name)
        return Chain(config.rule, config.gamma_max, drafter, table, GammaPolicy(predictor, config.gamma_max))
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
}
DRAFTED = tuple(m for m, build in METHODS.items() if build is _drafted)  # the methods that need a drafter
