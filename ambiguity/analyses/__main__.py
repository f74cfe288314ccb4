"""``python -m ambiguity.analyses <analysis> [options]``: dispatch to one analysis CLI."""
from __future__ import annotations

import sys

from ambiguity.errors import ArgumentParser, UsageError, cli_main

ANALYSES = {
    "concentration": "ambiguity.analyses.concentration",
    "interchangeability": "ambiguity.analyses.interchangeability",
}


@cli_main
def main(argv=None) -> int:
    """Run ``ANALYSES[argv[0]].main(argv[1:])``; exit 2 with one line for an unknown analysis."""
    import importlib

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = ArgumentParser(prog="python -m ambiguity.analyses",
                        description="Analyses of LANTERN's latent-proximity premise. "
                                    "Run `python -m ambiguity.analyses <analysis> --help` for options.")
    ap.add_argument("analysis", choices=sorted(ANALYSES))
    ap.add_argument("options", nargs="...", help="options of the analysis")
    if not argv:
        ap.print_usage(sys.stderr)
        raise UsageError(f"name an analysis: {' or '.join(sorted(ANALYSES))}")
    if argv[0] in ("-h", "--help"):
        ap.parse_args(argv)
    ns = ap.parse_args(argv[:1])
    return importlib.import_module(ANALYSES[ns.analysis]).main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
