"""Every script in benchmarks/ writes, by default, under the git-ignored ``runs/benchmarks/`` (a casual run
never overwrites the committed ``benchmarks/results/``): its parser's ``--out`` default, read without
running anything."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ambiguity.cli import ArgumentParser

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py"))


class _Parsed(Exception):
    """Raised instead of parsing: carries the parser a script's ``main`` built."""


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_defaults_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_runs_is_git_ignored():
    assert "runs/" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.parametrize("name", SCRIPTS)
def test_default_out_lies_under_runs_benchmarks(name, monkeypatch):
    mod = _module(name)

    def grab(self, args=None, namespace=None):
        raise _Parsed(self)

    monkeypatch.setattr(ArgumentParser, "parse_args", grab)
    with pytest.raises(_Parsed) as caught:
        mod.main([])
    parser = caught.value.args[0]
    out = parser.get_default("out")
    if out is None:  # bench_scaleout: runs/benchmarks/bench_scaleout/scaleout_<command>.json, set after parsing
        out = mod.OUT / "scaleout_profile.json"
    rel = Path(out).resolve().relative_to(ROOT / "runs" / "benchmarks")  # ValueError when elsewhere
    assert rel.parts[0] == name
