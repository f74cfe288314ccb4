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

# public name -> the module that defines it
_API = {
    "AcceptanceRule": "lantern.acceptance",
    "Verdict": "lantern.acceptance",
    "RULES": "lantern.acceptance",
    "BOUNDS": "lantern.acceptance",
    "judge": "lantern.acceptance",
    "judge_greedy": "lantern.acceptance",
    "residual": "lantern.acceptance",
    "relaxed_mass": "lantern.acceptance",
    "output_distribution": "lantern.acceptance",
    "output_distributions": "lantern.acceptance",
    "tvd": "lantern.divergences",
    "jsd": "lantern.divergences",
    "moved_jsd": "lantern.divergences",
    "DecodeConfig": "lantern.decoding",
    "METHODS": "lantern.decoding",
    "decode": "lantern.decoding",
    "compile_forwards": "lantern.decoding",
    "speculative_decode": "lantern.chain",
    "autoregressive_decode": "lantern.chain",
    "neighbour_table": "lantern.decoding",
    "batched_decode": "lantern.batched",
    "JacobiConfig": "lantern.jacobi_config",
    "jacobi_decode": "lantern.jacobi",
    "gsd_output_distribution": "lantern.jacobi_rules",
    "DraftModel": "lantern.drafter.model",
    "Drafter": "lantern.drafter.model",
    "load_drafter": "lantern.drafter.model",
    "Decoded": "lantern.records",
    "summarize_decode": "lantern.records",
    "summary_table": "lantern.records",
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
    "TreeSpec": "lantern.tree_spec",
    "STATIC_TREES": "lantern.tree_spec",
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
