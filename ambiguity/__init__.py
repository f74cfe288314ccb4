"""Token-selection ambiguity of visual AR models: profiles, latent neighbourhoods, model adapters.

The names a notebook needs, at package level::

    import ambiguity as amb
    model = amb.load_model("embedded")
    df, summary = amb.profile_model(model, num_images=64, sampling=amb.SamplingConfig(guidance=4.0))
    nb = amb.model_neighbourhoods(model, k=64, metric="l2")

Names are resolved on first use from the table below (PEP 562), so ``import ambiguity`` stays
cheap and ``python -m ambiguity.<command>`` does not import its own module twice (runpy warns
when a package imports the module it is about to run). ``python -m ambiguity`` lists the commands.
"""

from __future__ import annotations

import importlib

from ambiguity.openmp import passive_wait_for_commands

passive_wait_for_commands()  # python -m <command> only: OpenMP waits passively on a shared CPU

# public name -> the module that defines it
_API = {
    "UsageError": "ambiguity.errors",
    "WeightsNotFoundError": "ambiguity.errors",
    "TokenModel": "ambiguity.models.base",
    "Prompt": "ambiguity.models.base",
    "Step": "ambiguity.models.base",
    "load_model": "ambiguity.models.registry",
    "available_models": "ambiguity.models.registry",
    "register": "ambiguity.models.registry",
    "ModelSpec": "ambiguity.models.catalog",
    "SamplingConfig": "ambiguity.sampling",
    "distribution": "ambiguity.sampling",
    "pick": "ambiguity.sampling",
    "default_guidance": "ambiguity.sampling",
    "image_seed": "ambiguity.seeding",
    "image_generator": "ambiguity.seeding",
    "image_generators": "ambiguity.seeding",
    "sample_tokens": "ambiguity.generation",
    "token_stats": "ambiguity.stats",
    "top1_prob": "ambiguity.stats",
    "topk_mass": "ambiguity.stats",
    "entropy": "ambiguity.stats",
    "profile_model": "ambiguity.profile",
    "summarize_profile": "ambiguity.profile",
    "plot_distributions": "ambiguity.profile_report",
    "plot_position_means": "ambiguity.profile_report",
    "write_outputs": "ambiguity.profile_report",
    "Neighbourhoods": "ambiguity.neighbourhood",
    "build_neighbourhoods": "ambiguity.neighbourhood",
    "model_neighbourhoods": "ambiguity.neighbourhood",
    "load_neighbourhoods": "ambiguity.neighbourhood",
    "run_concentration": "ambiguity.analyses.concentration",
    "run_interchangeability": "ambiguity.analyses.interchangeability",
    "compare_models": "ambiguity.compare",
    "CompareSettings": "ambiguity.compare",
    "RunDir": "ambiguity.runs",
    "RunOptions": "ambiguity.runs",
    "plots": "ambiguity.plots",
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'ambiguity' has no attribute {name!r}")
    module = importlib.import_module(_API[name])
    value = module if name == "plots" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
