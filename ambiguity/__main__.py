"""``python -m ambiguity``: the package's commands (each also runs as ``python -m <module>``)."""

from __future__ import annotations

from ambiguity.cli import run_subcommand

COMMANDS = {
    "profile": ("ambiguity.profile", "next-token ambiguity of a target model: table, summary, figures"),
    "neighbourhood": ("ambiguity.neighbourhood", "exact k-nearest-neighbour table B_k of a codebook (FAISS)"),
    "analyses": ("ambiguity.analyses", "concentration / interchangeability: tests of LANTERN's latent premise"),
    "compare": ("ambiguity.compare", "ambiguity across models side by side (LANTERN Fig. 2)"),
    "merge": ("ambiguity.merge", "assemble a sharded run's outputs from its parts (after --num-shards)"),
}

if __name__ == "__main__":
    raise SystemExit(run_subcommand("python -m ambiguity", COMMANDS))
