"""Tokens per target forward of the row-parallel methods (ZipAR, PJD) against AR and SJD.

    python benchmarks/spatial_tokens.py --model embedded-16 --num-images 64 --out benchmarks/results

The same conditions (labels ``i % 10``) and per-image seeds for every setting, decoded
``--batch-size`` at a time (the counts do not depend on it). ``tokens_per_forward`` = generated
tokens / target forwards (the prefill counted; AR gives 1); ``drafts_per_forward`` = drafts judged
(reached) per verification forward (PJD's windows, ZipAR's adaptive row starts);
``acceptance_rate`` = committed / judged drafts; ``ar_nll`` = the mean AR negative log-likelihood
(nats per token) of the decoded images under the target's sampling distribution, a distortion
proxy (AR's own samples give its entropy rate), and ``ar_nll_se`` its standard error over images.
Settings wider than the model's rows are skipped. Writes
``--out/spatial_tokens_<model>.csv`` (default ``runs/benchmarks/spatial_tokens``, untracked).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ambiguity.cli import ArgumentParser, add_guidance_arg, add_out_arg, check_out_dir, cli_main, positive_int
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig, distribution, expand_rows
from lantern.engine.decode import DecodeConfig, decode

SETTINGS = (
    ("ar", {}),
    ("sjd", {"window": 16}),
    ("zipar", {"window": 8}),
    ("zipar", {"window": 4}),
    ("zipar", {"window": 2}),
    ("zipar", {"window": 4, "adaptive": True}),
    ("zipar", {"window": 2, "adaptive": True}),
    ("pjd", {"rows": 8, "offset": 8}),
    ("pjd", {"rows": 8, "offset": 4}),
    ("pjd", {"rows": 4, "offset": 2}),
)


def _config(method: str, knobs: dict) -> DecodeConfig:
    if method == "sjd":
        return DecodeConfig.of(method, **knobs)
    return DecodeConfig.of(method, **knobs)


@torch.no_grad()
def ar_nll(model, labels, tokens, sampling: SamplingConfig) -> np.ndarray:
    """Per image, the mean -log p_AR(x_i | x_<i) (nats per token) of decoded images under the target's own
    sampling distribution (teacher forcing): AR samples give the entropy rate; a method that
    draws tokens from less context than AR moves it."""
    prompt = model.make_prompt(labels, guided=sampling.guided)
    x = tokens.to(model.device)
    logits = model.teacher_force(prompt, expand_rows(x, sampling.guided)).logits
    p = distribution(logits, sampling, sampling.guided).double()
    return (-p.gather(-1, x[..., None])[..., 0].clamp_min(1e-300).log()).mean(-1).cpu().numpy()


def measure(model, num_images: int, guidance: float, batch_size: int, seed: int) -> pd.DataFrame:
    """One row per setting of :data:`SETTINGS` the model's grid allows."""
    W = int(model.grid[1])
    sampling = SamplingConfig(guidance=guidance, temperature=1.0)
    labels = [i % 10 for i in range(num_images)]
    rows = []
    for method, knobs in SETTINGS:
        if method in ("zipar", "pjd") and max(knobs.values()) > W:
            continue
        out = decode(model, labels, _config(method, knobs), sampling, seed=seed, batch_size=batch_size)
        forwards = int(out.images["target_forwards"].sum())
        nll = ar_nll(model, labels, out.tokens, sampling)
        judged = int(np.sum(out.drafts["reached"])) if len(out.drafts["token"]) else 0
        rows.append(
            dict(
                model=model.name,
                method=method,
                setting=", ".join(f"{k}={v}" for k, v in knobs.items()),
                images=num_images,
                tokens_per_forward=out.tokens.numel() / forwards,
                drafts_per_forward=judged / max(1, len(out.steps["step"])),
                acceptance_rate=float(np.sum(out.drafts["committed"])) / judged if judged else float("nan"),
                ar_nll=float(nll.mean()),
                ar_nll_se=float(nll.std() / np.sqrt(len(nll))),
            )
        )
    return pd.DataFrame(rows)


@cli_main
def main(argv=None) -> int:
    p = ArgumentParser(prog="benchmarks/spatial_tokens.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embedded-16")
    p.add_argument("--num-images", type=positive_int, default=8)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--seed", type=int, default=0)
    add_guidance_arg(p, 4.0)
    add_out_arg(p, "directory of the CSV", "runs/benchmarks/spatial_tokens")
    args = p.parse_args(argv)
    out = check_out_dir(Path(args.out))
    model = load_model(args.model)
    table = measure(model, args.num_images, args.cfg, args.batch_size, args.seed)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"spatial_tokens_{model.name}.csv"
    table.to_csv(path, index=False, float_format="%.4f")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
