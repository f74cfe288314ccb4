"""Token-selection ambiguity of visual AR models: profiles, latent neighbourhoods, model adapters.

The names a notebook needs, at package level::

    import ambiguity as amb
    model = amb.load_model("embedded")
    df, summary = amb.profile_model(model, num_images=64, sampling=amb.SamplingConfig(guidance=4.0))
    nb = amb.model_neighbourhoods(model, k=64, metric="l2")

Names are resolved on first use from the table below (PEP 562), so ``import ambiguity`` stays
cheap and ``python -m ambiguity.<command>`` does not import its own module twice (runpy warns
when a package imports the module it is about to run). A function whose module is also a
command keeps another name here (``profile_model`` is :func:`ambiguity.profile.profile`,
``compare_models`` is :func:`ambiguity.compare.compare`; ``summarize_profile`` is
:func:`ambiguity.profile.summarize`, apart from ``lantern.summarize_decode``), because a package attribute cannot
be both the function and the submodule. ``python -m ambiguity`` lists the commands.
"""

from __future__ import annotations

import importlib
import os
import sys

if "torch" not in sys.modules:
    # Decoding runs thousands of tiny ops; with OpenMP's default busy-waiting, two threads on CPU
    # cores shared with other work ran 10x slower than one. Passive waiting keeps the speed of
    # an idle machine. It must be set before torch starts OpenMP; set OMP_WAIT_POLICY to override.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# public name -> "module" (the name is the module's own attribute) or "module:attribute"
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
    "profile_model": "ambiguity.profile:profile",
    "summarize_profile": "ambiguity.profile:summarize",
    "plot_distributions": "ambiguity.profile_report",
    "plot_position_means": "ambiguity.profile_report",
    "write_outputs": "ambiguity.profile_report",
    "Neighbourhoods": "ambiguity.neighbourhood",
    "build_neighbourhoods": "ambiguity.neighbourhood",
    "model_neighbourhoods": "ambiguity.neighbourhood",
    "load_neighbourhoods": "ambiguity.neighbourhood",
    "run_concentration": "ambiguity.analyses.concentration",
    "run_interchangeability": "ambiguity.analyses.interchangeability",
    "compare_models": "ambiguity.compare:compare",
    "CompareSettings": "ambiguity.compare",
    "RunDir": "ambiguity.runs",
    "RunOptions": "ambiguity.runs",
    "plots": "ambiguity.plots",
}
__all__ = sorted(_API)
# former package-level names -> their names now (they collided with ``lantern``'s); still resolved, with a warning
_RENAMED = {"summarize": "summarize_profile"}


def __getattr__(name: str):
    if name in _RENAMED:
        import warnings

        warnings.warn(f"ambiguity.{name} is now ambiguity.{_RENAMED[name]}", DeprecationWarning, stacklevel=2)
        return __getattr__(_RENAMED[name])
    if name not in _API:
        raise AttributeError(f"module 'ambiguity' has no attribute {name!r}")
    module_name, _, attribute = _API[name].partition(":")
    module = importlib.import_module(module_name)
    value = module if name == "plots" else getattr(module, attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
