"""The documentation is checked like code.

* ``docs/architecture.md``'s layer table is held against the imports: every module of ``ambiguity/``
  and ``lantern/`` sits in exactly one layer, and imports (module-level or inside functions) only
  from its own layer or the layers below.
* The README stays short, keeps the Quick start commands, and its relative links resolve.

``mkdocs build --strict`` (broken links, missing pages) runs in ``.ci/run``, not here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ambiguity", "lantern")
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"
QUICK_START = (
    "pip install torch==2.13.0 && pip install -e . && python -m ambiguity.profile",
    'pip install torch==2.13.0 && pip install -e ".[dev]" && python -m pytest -q',
)


# --- the layer table ---------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern:
    """A path pattern of the table as a regex over module paths without ``.py``.

    ``*`` matches within one folder, ``**`` across folders, a trailing ``/`` everything under the
    folder (its ``__init__`` included); ``.py`` may be left off."""
    pattern = pattern.strip()
    if pattern.endswith("/"):
        pattern += "**"
    pattern = pattern.removesuffix(".py")
    out = []
    for part in re.split(r"(\*\*|\*|\?)", pattern):
        out.append({"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part)))
    return re.compile("".join(out))


def layer_table(text: str) -> dict[int, list[str]]:
    """Layer number -> path patterns, from the first table whose header starts ``| layer | modules``."""
    rows, in_table = {}, False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else None
        if cells is None:
            if in_table:
                break
            continue
        if not in_table:
            in_table = [c.lower() for c in cells[:2]] == ["layer", "modules"]
            continue
        if set(cells[0]) <= set("-: "):  # the separator row
            continue
        assert cells[0].isdigit(), f"layer table: the first cell must be a layer number, got {cells[0]!r}"
        patterns = re.findall(r"`([^`]+)`", cells[1])
        assert patterns, f"layer {cells[0]}: no `path` patterns"
        rows.setdefault(int(cells[0]), []).extend(patterns)
    assert rows, f"no '| layer | modules |' table in {ARCHITECTURE}"
    return rows


def package_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the two packages (a package is its ``__init__``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _known(name: str, modules) -> str | None:
    """The longest prefix of a dotted name that is one of our modules (``a.b.func`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(name: str, path: Path, modules) -> set[str]:
    """Our modules that ``name`` imports anywhere in its file: module level, in functions, under
    ``TYPE_CHECKING``. ``from pkg import mod`` counts as importing ``pkg.mod`` when that is a module."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(_known(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                found.add(full if full in modules else _known(source, modules))
    found.discard(None)
    found.discard(name)
    return found


def _module_path(name: str, path: Path) -> str:
    return path.relative_to(ROOT).with_suffix("").as_posix()


@pytest.fixture(scope="module")
def layers():
    """Module name -> its layer, checking that every module matches exactly one row's patterns."""
    table = layer_table(ARCHITECTURE.read_text())
    modules = package_modules()
    compiled = {layer: [(p, _pattern_regex(p)) for p in patterns] for layer, patterns in table.items()}
    placed, unplaced, twice = {}, [], []
    used = set()
    for name, path in modules.items():
        where = _module_path(name, path)
        matched = [(layer, p) for layer, pats in compiled.items() for p, rx in pats if rx.fullmatch(where)]
        used.update(p for _, p in matched)
        hits = {layer for layer, _ in matched}
        if not hits:
            unplaced.append(where + ".py")
        elif len(hits) > 1:
            twice.append(f"{where}.py (layers {sorted(hits)})")
        else:
            placed[name] = hits.pop()
    stale = sorted(p for pats in table.values() for p in pats if p not in used)
    assert not unplaced, f"modules in no layer of docs/architecture.md (place each in one row): {unplaced}"
    assert not twice, f"modules in more than one layer of docs/architecture.md: {twice}"
    assert not stale, f"patterns in docs/architecture.md that match no module (moved or deleted?): {stale}"
    return placed


def test_every_module_imports_only_from_its_layer_or_below(layers):
    modules = package_modules()
    upward = []
    for name, path in modules.items():
        for dep in sorted(imports_of(name, path, modules)):
            if layers[dep] > layers[name]:
                upward.append(
                    f"{_module_path(name, path)}.py (layer {layers[name]}) imports {dep} (layer {layers[dep]})"
                )
    assert not upward, "imports from a higher layer (docs/architecture.md):\n" + "\n".join(upward)


def test_ambiguity_never_imports_lantern():
    modules = package_modules()
    bad = [
        f"{name} imports {dep}"
        for name, path in modules.items()
        if name.split(".")[0] == "ambiguity"
        for dep in imports_of(name, path, modules)
        if dep.split(".")[0] == "lantern"
    ]
    assert not bad, bad


def test_layer_checker_sees_lazy_and_relative_imports(tmp_path):
    """The checker itself: an import inside a function and a relative import both count."""
    modules = {"ambiguity.errors": None, "ambiguity.models": None, "ambiguity.models.base": None, "lantern.x": None}
    source = tmp_path / "__init__.py"
    source.write_text(
        "from . import base\n"
        "from ..errors import UsageError\n"
        "def f():\n"
        "    import lantern.x\n"
        "    from ambiguity.models.base import TokenModel\n"
    )
    assert imports_of("ambiguity.models", source, modules) == {"ambiguity.models.base", "ambiguity.errors", "lantern.x"}
    assert _pattern_regex("lantern/engine/*").fullmatch("lantern/engine/slots")
    assert not _pattern_regex("lantern/*.py").fullmatch("lantern/paper/report")
    assert _pattern_regex("lantern/paper/").fullmatch("lantern/paper/__init__")
    assert _pattern_regex("lantern/methods/**").fullmatch("lantern/methods/chain/rounds")


# --- the README --------------------------------------------------------------------------------


def test_readme_is_short_and_keeps_the_quick_start():
    text = README.read_text()
    assert len(text.splitlines()) <= 300, "README.md is at most 300 lines: move details to docs/"
    for command in QUICK_START:
        assert command in text, f"README.md lost the Quick start command {command!r}"


def _relative_targets(text: str) -> list[str]:
    """Link and image targets of markdown and HTML that are paths in the repository."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold commands, not links
    targets = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    targets += re.findall(r"""(?:src|href)=["']([^"']+)["']""", text)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:|^#|^//", t, flags=re.I)]


def test_readme_relative_links_point_to_files():
    targets = _relative_targets(README.read_text())
    assert targets, "README.md links to no file: expected at least the docs and a figure"
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
