"""Every script in benchmarks/ writes, by default, under the git-ignored ``runs/benchmarks/`` (a casual run
never overwrites the committed ``benchmarks/results/`` or ``figures/``): its parser's ``--out`` default,
read without running anything, and no default of any option lies under ``figures/``; the figures of
bench_decoding and compare_methods go into ``--out`` unless ``--figure`` names a path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ambiguity.cli import ArgumentParser

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "common")  # common: no script


class _Parsed(Exception):
    """Raised instead of parsing: carries the parser a script's ``main`` built."""


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_defaults_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_runs_is_git_ignored():
    assert "runs/" in (ROOT / ".gitignore").read_text().splitlines()


def _parser(name: str, monkeypatch) -> ArgumentParser:
    mod = _module(name)

    def grab(self, args=None, namespace=None):
        raise _Parsed(self)

    monkeypatch.setattr(ArgumentParser, "parse_args", grab)
    with pytest.raises(_Parsed) as caught:
        mod.main([])
    return mod, caught.value.args[0]


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_default_writes_into_the_committed_figures(name, monkeypatch):
    _, parser = _parser(name, monkeypatch)
    figures = (ROOT / "figures").resolve()
    for action in parser._actions:
        d = action.default
        if isinstance(d, (str, Path)) and str(d):
            assert figures not in Path(d).resolve().parents and Path(d).resolve() != figures, (action.dest, d)


@pytest.mark.parametrize("name", ["bench_decoding", "compare_methods"])
def test_the_figure_goes_into_out_unless_named(name, monkeypatch):
    _, parser = _parser(name, monkeypatch)
    assert parser.get_default("figure") is None  # resolved after parsing: <out>/<stem>
    src = (ROOT / "benchmarks" / f"{name}.py").read_text()
    assert 'Path("figures")' not in src and '"figures"' not in src


@pytest.mark.parametrize("name", SCRIPTS)
def test_default_out_lies_under_runs_benchmarks(name, monkeypatch):
    mod, parser = _parser(name, monkeypatch)
    out = parser.get_default("out")
    if out is None:  # bench_scaleout: runs/benchmarks/bench_scaleout/scaleout_<command>.json, set after parsing
        out = mod.OUT / "scaleout_profile.json"
    rel = Path(out).resolve().relative_to(ROOT / "runs" / "benchmarks")  # ValueError when elsewhere
    assert rel.parts[0] == name
