"""Figure of the embedded Fashion-MNIST model: per class, real test images, their VQ
reconstructions, and class-conditional samples of the GPT.

    python scripts/figure_embedded_samples.py            # -> figures/embedded_samples.{png,pdf}
    python scripts/figure_embedded_samples.py --cfg 4 --temperature 0.9 --out /tmp/samples
    python scripts/figure_embedded_samples.py --model embedded-16   # -> figures/embedded16_samples.{png,pdf}

Seeded (``--seed``): the same test images and samples on every run on the same device.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ambiguity.cli import (
    ArgumentParser,
    add_data_arg,
    add_device_args,
    add_out_arg,
    add_sampling_args,
    check_out_file,
    cli_main,
    positive_int,
    seed_int,
)
from ambiguity.data.fashion_mnist import CLASSES, load_split
from ambiguity.generation import sample_tokens
from ambiguity.io import atomic_path, ensure_writable_dir
from ambiguity.memory import check_batch
from ambiguity.models.base import resolve_device
from ambiguity.models.embedded import VARIANTS, load_embedded, weights_dir
from ambiguity.sampling import SamplingConfig
from ambiguity.seeding import image_generators, subset_seed

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = ArgumentParser(prog="figure_embedded_samples.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model", choices=list(VARIANTS), default="embedded", help="which shipped model (default: %(default)s)"
    )
    p.add_argument("--weights", default=None, help="directory with the two weight files (default: the shipped ones)")
    add_data_arg(p)
    add_out_arg(
        p, "output path without suffix (default figures/embedded_samples, figures/embedded16_samples)", metavar="PATH"
    )
    p.add_argument("--seed", type=seed_int, default=0)
    add_sampling_args(p, guidance=2.0)
    p.add_argument("--n-real", type=positive_int, default=4, help="test images per class")
    p.add_argument("--n-samples", type=positive_int, default=6, help="generated samples per class")
    add_device_args(p, dtype=False)
    return p.parse_args(argv)


def pick_test_images(images: torch.Tensor, labels: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """n random test images of each class, class-major: (10 * n, 1, S, S) in [0, 1]."""
    g = torch.Generator().manual_seed(subset_seed(seed))
    rows = []
    for c in range(10):
        idx = (labels == c).nonzero().flatten()
        rows.append(images[idx[torch.randperm(idx.numel(), generator=g)[:n]]])
    return torch.cat(rows)


def mosaic(images: torch.Tensor, rows: int, gap: int = 2) -> torch.Tensor:
    """(rows * cols, 1, H, W) in [0, 1], row-major -> one (rows*(H+gap)-gap, cols*(W+gap)-gap)
    grey image with white gaps."""
    n, _, H, W = images.shape
    cols = n // rows
    out = torch.ones(rows * (H + gap) - gap, cols * (W + gap) - gap)
    for i in range(n):
        r, c = divmod(i, cols)
        out[r * (H + gap) : r * (H + gap) + H, c * (W + gap) : c * (W + gap) + W] = images[i, 0]
    return out


def draw(real, recon, samples, class_names, title_samples: str, note: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(context="paper", style="white")
    panels = [
        (mosaic(real, 10), "test images"),
        (mosaic(recon, 10), "VQ reconstructions"),
        (mosaic(samples, 10), title_samples),
    ]
    widths = [p[0].shape[1] for p in panels]
    scale = real.shape[-1] / 32  # the figure's size does not grow with the image side
    fig, axes = plt.subplots(
        1,
        3,
        figsize=(0.42 * sum(widths) / (34 * scale) + 1.4, 4.9),
        gridspec_kw={"width_ratios": widths, "wspace": 0.04},
    )
    H = panels[0][0].shape[0]
    for k, (ax, (img, title)) in enumerate(zip(axes, panels)):
        ax.imshow(img.numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([(H + 2) / 10 * (i + 0.5) - 1 for i in range(10)] if k == 0 else [])
        if k == 0:
            ax.set_yticklabels(class_names, fontsize=8)
        for s in ax.spines.values():
            s.set_visible(False)
    fig.text(0.5, 0.01, note, ha="center", fontsize=7, color="0.3")
    fig.subplots_adjust(left=0.12, right=0.99, top=0.93, bottom=0.08)
    return fig


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    import json

    sampling = SamplingConfig(guidance=args.cfg, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    device = resolve_device(args.device)
    stem = "embedded16_samples" if args.model == "embedded-16" else "embedded_samples"
    out = check_out_file(args.out or str(ROOT / "figures" / stem))
    model = load_embedded(args.weights, device=device, variant=args.model)
    check_batch(model, args.n_samples, model.num_tokens + 1, "--n-samples", rows_per_item=10 * (1 + sampling.guided))
    images, labels = load_split("test", args.data, size=model.image_shape[-1])
    real = pick_test_images(images, labels, args.n_real, args.seed)
    recon = model.decode_codes(model.encode_images(real.to(device))).cpu()
    conditions = [c for c in range(10) for _ in range(args.n_samples)]
    prompt = model.make_prompt(conditions, guided=sampling.guided)
    codes = sample_tokens(model, prompt, sampling, image_generators(args.seed, range(len(conditions)), device))
    samples = model.decode_codes(codes.view(-1, *model.grid)).cpu()

    knobs = (
        f"CFG {args.cfg:g}, temperature {args.temperature:g}"
        + (f", top-k {args.top_k}" if args.top_k else "")
        + (f", top-p {args.top_p:g}" if args.top_p < 1 else "")
    )
    metrics_path = weights_dir(args.weights) / VARIANTS[args.model].metrics_file
    note = f"{model.name} model (LlamaGen VQ + c2i GPT trained on Fashion-MNIST), seed {args.seed}"
    if metrics_path.is_file():
        m = json.loads(metrics_path.read_text())
        if "vq" in m and "gpt" in m:
            note += (
                f"\n{m['vq']['test']['codebook_size']} codes, test PSNR {m['vq']['test']['psnr_db']:.1f} dB, "
                f"GPT {m['gpt']['parameters'] / 1e6:.2f}M params, test NLL "
                f"{m['gpt']['test']['nll_bits_per_token']:.2f} bits/token"
            )
    fig = draw(real, recon, samples, CLASSES, f"samples ({knobs})", note)
    ensure_writable_dir(out.parent)
    written = []
    for ext in ("png", "pdf"):
        path = out.with_name(out.name + "." + ext)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, dpi=200)
        written.append(str(path))
    print("wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
