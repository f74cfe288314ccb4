"""LANTERN relaxed speculative decoding: acceptance rules, the EAGLE drafter, decoding, replay.

The names a notebook needs, at package level::

    import ambiguity as amb, lantern as lt
    model = amb.load_model("embedded")
    out = lt.decode(model, list(range(10)), lt.DecodeConfig.of("lantern", gamma=4, k=64, delta=0.2),
                    amb.SamplingConfig(guidance=4.0), drafter=lt.load_drafter(model), pixels=True)
    out.summary()

Names are resolved on first use from the table below (PEP 562), as in :mod:`ambiguity`, so that
``python -m lantern.<command>`` never imports its own module twice. ``python -m lantern`` lists
the commands.
"""

from __future__ import annotations

import importlib

from ambiguity.openmp import passive_wait_for_commands

passive_wait_for_commands()  # python -m <command> only: OpenMP waits passively on a shared CPU

# public name -> the module that defines it
_API = {
    "AcceptanceRule": "lantern.rules.acceptance",
    "Verdict": "lantern.rules.acceptance",
    "RULES": "lantern.rules.acceptance",
    "BOUNDS": "lantern.rules.acceptance",
    "judge": "lantern.rules.acceptance",
    "judge_greedy": "lantern.rules.acceptance",
    "residual": "lantern.rules.acceptance",
    "relaxed_mass": "lantern.rules.acceptance",
    "output_distribution": "lantern.rules.output",
    "output_distributions": "lantern.rules.output",
    "tvd": "lantern.rules.divergences",
    "jsd": "lantern.rules.divergences",
    "moved_jsd": "lantern.rules.divergences",
    "DecodeConfig": "lantern.engine.decode",
    "METHODS": "lantern.engine.decode",
    "decode": "lantern.engine.decode",
    "build_method": "lantern.engine.decode",
    "Method": "lantern.engine.method",
    "compile_forwards": "lantern.engine.decode",
    "neighbour_table": "lantern.engine.decode",
    "JacobiConfig": "lantern.methods.jacobi.config",
    "PacConfig": "lantern.methods.sjd_pac.config",
    "gsd_output_distribution": "lantern.rules.jacobi",
    "DraftModel": "lantern.drafter.model",
    "Drafter": "lantern.drafter.model",
    "load_drafter": "lantern.drafter.model",
    "Decoded": "lantern.engine.records",
    "summarize_decode": "lantern.engine.records",
    "summary_table": "lantern.engine.records",
    "run_generate": "lantern.generate",
    "load_run": "lantern.run_reader",
    "acceptance_by_ambiguity": "lantern.replay",
    "image_quality": "lantern.run_reader",
    "train_drafter": "lantern.drafter.train",
    "TrainConfig": "lantern.drafter.train",
    "evaluate_runs": "lantern.evaluate",
    "score_images": "lantern.evaluate",
    "flat_scores": "lantern.quality.tables",
    "QualityProtocol": "lantern.quality.scoring",
    "load_extractor": "lantern.quality.features",
    "Extractor": "lantern.quality.features",
    "frechet_distance": "lantern.quality.metrics",
    "TreeSpec": "lantern.methods.tree.spec",
    "STATIC_TREES": "lantern.methods.tree.spec",
    "interleaved_timing": "lantern.timing",
    "speedup_table": "lantern.timing",
    "speedup_curve": "lantern.timing",
    "real_pairs": "lantern.distortion",
    "distortion_table": "lantern.distortion",
    "run_paper": "lantern.paper",
    "PaperConfig": "lantern.paper.config",
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'lantern' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
