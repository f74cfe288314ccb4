"""The command-line options a decoding method declares (the plug-in interface with :mod:`~lantern.engine.method`).

A method module declares its options as :class:`OptionGroup` s (``lantern.methods.chain.OPTIONS``,
``lantern.methods.tree.spec.OPTIONS``, ``lantern.methods.jacobi.config.OPTIONS``, and the
acceptance rule's, read by chains and draft trees alike, ``lantern.methods.drafting.RULE_OPTIONS``).
:data:`lantern.methods.registry.OPTIONS` collects them and :func:`add_method_options` adds each as
its own argparse group under ``--method`` (so ``--help`` lists every method's options apart). Each
option records, when typed, the group that declared it; :func:`check_method_options` then refuses an
option whose group does not apply to the chosen method (and draft shape), in one line naming the
methods it is for. The refusal follows from where an option was declared: there is no table of
flags to keep in step and no second parse of the command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

from ambiguity.errors import UsageError

__all__ = ["OptionGroup", "add_method_options", "check_method_options"]


@dataclass(frozen=True)
class OptionGroup:
    """Options one family of methods reads.

    title: the ``--help`` heading; methods: the ``--method`` values that read them; add: adds the
    options to an argparse group (plain ``store`` options); refuse: ``args -> reason or None``, a
    further condition on the parsed arguments (the draft shape, ``--k 0``), its reason completing
    ``"--flag does not apply <reason>; drop it"``; hint: ``method -> text`` appended to the
    wrong-method line (which flag bounds that method instead).
    """

    title: str
    methods: tuple[str, ...]
    add: Callable[[argparse._ArgumentGroup], None]
    refuse: Optional[Callable[[argparse.Namespace], Optional[str]]] = None
    hint: Optional[Callable[[str], str]] = None

    def refusal(self, args: argparse.Namespace) -> Optional[str]:
        """Why this group's options do not apply to ``args`` (None: they do)."""
        if args.method not in self.methods:
            hint = self.hint(args.method) if self.hint is not None else ""
            return f"to --method {args.method}, only to {', '.join(self.methods)}{hint}"
        return self.refuse(args) if self.refuse is not None else None


class _Declared(argparse._StoreAction):
    """``store`` that also records, when typed, its dest in ``namespace.typed`` (at the default
    value too), so :func:`check_method_options` sees what the user typed."""

    group: Optional[OptionGroup] = None

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        namespace.typed = getattr(namespace, "typed", set()) | {self.dest}


def add_method_options(parser: argparse.ArgumentParser, groups: Sequence[OptionGroup]) -> None:
    """Add each group's options as its own argparse group; every option records its group."""
    for og in groups:
        g = parser.add_argument_group(f"{og.title} ({', '.join(og.methods)})")
        before = len(g._group_actions)
        og.add(_Adder(g))
        for action in g._group_actions[before:]:
            action.group = og


class _Adder:
    """An argparse group whose ``add_argument`` makes :class:`_Declared` options."""

    def __init__(self, group: argparse._ArgumentGroup):
        self._group = group

    def add_argument(self, *flags, **kwargs):
        return self._group.add_argument(*flags, action=_Declared, **kwargs)


def check_method_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Raise UsageError for the first typed option (``args.typed``) whose declaring group does not
    apply to ``args`` (:meth:`OptionGroup.refusal`): ``--FLAG does not apply <reason>; drop it``."""
    typed = getattr(args, "typed", set())
    for action in parser._actions:
        og = getattr(action, "group", None)
        if og is None or action.dest not in typed:
            continue
        why = og.refusal(args)
        if why is not None:
            raise UsageError(f"{action.option_strings[0]} does not apply {why}; drop it")
