"""Train the Fashion-MNIST classifier behind the ``fmnist`` feature extractor (lantern.quality).

    python scripts/train_fmnist_classifier.py                       # -> lantern/weights/fmnist_classifier.*
    python scripts/train_fmnist_classifier.py --quick --out /tmp/c  # seconds-long smoke run

Images are in the embedded model's format (1 x 32 x 32, 28 x 28 padded by 2 px, [0, 1]).
Recipe: AdamW (lr 2e-3, weight decay 5e-4, betas 0.9/0.999), batch 128, linear warmup then
cosine decay to 5 % over ``--epochs`` epochs; augmentation: horizontal flip (p = 0.5) and a
random shift of up to 2 px (zero fill), drawn from a generator seeded by (seed, step). The
batch of step s depends only on (seed, s) (:func:`ambiguity.train.batch_indices`), and a
checkpoint is written every ``--ckpt-every`` steps to ``--run-dir``, so an interrupted run
resumes exactly. Writes ``fmnist_classifier.safetensors`` (float32, config in the metadata)
and ``fmnist_classifier_metrics.json`` (test accuracy and cross-entropy on the 10k test
images, measured on the saved file reloaded, per-class accuracy, recipe, wall time).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from ambiguity.cli import ArgumentParser, add_data_arg, add_out_arg, add_threads_arg, cli_main, positive_int, seed_int
from ambiguity.data.fashion_mnist import CLASSES, load_split
from ambiguity.io import ensure_writable_dir, write_json
from ambiguity.models.checkpoints import save_module
from ambiguity.runs import file_sha256
from ambiguity.seeding import augment_seed, classifier_init_seed
from ambiguity.train_loop import batch_indices, check_resume, count_params, load_checkpoint, lr_at, save_checkpoint
from lantern.quality.fmnist import METRICS_FILE, WEIGHTS_FILE, FashionNet, FashionNetConfig, load_fashion_net

ROOT = Path(__file__).resolve().parents[1]


def augment(x: torch.Tensor, seed: int, step: int) -> torch.Tensor:
    """Random horizontal flip and a shift of up to 2 px (zero fill) per image, seeded by (seed, step)."""
    g = torch.Generator().manual_seed(augment_seed(seed, step))
    flip = torch.rand(len(x), generator=g) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    shifts = torch.randint(-2, 3, (len(x), 2), generator=g)
    pad = F.pad(x, (2, 2, 2, 2))
    H, W = x.shape[-2:]
    return torch.stack(
        [pad[i, :, 2 + dy : 2 + dy + H, 2 + dx : 2 + dx + W] for i, (dy, dx) in enumerate(shifts.tolist())]
    )


@torch.no_grad()
def evaluate(model: FashionNet, images: torch.Tensor, labels: torch.Tensor, batch: int = 500) -> dict:
    """Accuracy, mean cross-entropy (nats) and per-class accuracy on (images, labels)."""
    model.eval()
    logits = torch.cat([model(images[s : s + batch]) for s in range(0, len(images), batch)])
    pred = logits.argmax(1)
    per_class = {CLASSES[c]: float((pred[labels == c] == c).float().mean()) for c in range(len(CLASSES))}
    return {
        "accuracy": float((pred == labels).float().mean()),
        "cross_entropy": float(F.cross_entropy(logits, labels)),
        "per_class_accuracy": per_class,
        "images": int(len(labels)),
    }


def train(cfg: FashionNetConfig, recipe: dict, images, labels, run_dir: Path, progress: bool = True) -> FashionNet:
    """The training loop (module docstring); resumes from ``run_dir/checkpoint.pt``."""
    torch.manual_seed(classifier_init_seed(recipe["seed"]))
    model = FashionNet(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"])
    total = recipe["epochs"] * len(images) // recipe["batch_size"]
    ck_path, step = run_dir / "checkpoint.pt", 0
    ck = load_checkpoint(ck_path, fix="delete it to start over, or pass another --run-dir")
    if ck is not None:
        check_resume(ck, recipe, ck_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step = ck["step"]
        print(f"resuming at step {step}/{total}")
    model.train()
    t0, run_loss, seen = time.perf_counter(), 0.0, 0
    while step < total:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe["lr"], recipe["warmup"], total, 0.05)
        idx = batch_indices(step, recipe["batch_size"], len(images), recipe["seed"])
        x = augment(images[idx], recipe["seed"], step)
        loss = F.cross_entropy(model(x), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        run_loss, seen = run_loss + loss.item(), seen + 1
        if step % recipe["ckpt_every"] == 0 or step == total:
            save_checkpoint(ck_path, model=model.state_dict(), opt=opt.state_dict(), step=step, recipe=recipe)
            if progress:
                print(f"step {step}/{total} loss {run_loss / seen:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
            run_loss, seen = 0.0, 0
    return model.eval()


@cli_main
def main(argv=None) -> int:
    p = ArgumentParser(prog="train_fmnist_classifier.py", description=__doc__.split("\n")[0])
    add_data_arg(p)
    add_out_arg(p, "where the weight and metrics files go (default: lantern/weights)")
    p.add_argument("--run-dir", default=None, help="checkpoints (default: runs/fmnist_classifier)")
    p.add_argument("--epochs", type=positive_int, default=8)
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--ckpt-every", type=positive_int, default=100)
    add_threads_arg(p, 1)
    p.add_argument("--quick", action="store_true", help="1k images, a few steps, tiny widths (smoke test)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    run_dir = ensure_writable_dir(
        Path(args.run_dir or ROOT / "runs" / ("fmnist_classifier" + "-quick" * args.quick)), "--run-dir"
    )
    out = ensure_writable_dir(Path(args.out) if args.out else WEIGHTS_FILE.parent)
    limit = 1000 if args.quick else None
    train_x, train_y = load_split("train", args.data, limit)
    test_x, test_y = load_split("test", args.data, limit)
    cfg = FashionNetConfig(widths=[4, 8, 8], feature_dim=16) if args.quick else FashionNetConfig()
    recipe = {
        "seed": args.seed,
        "epochs": 1 if args.quick else args.epochs,
        "batch_size": 128,
        "lr": 2e-3,
        "weight_decay": 5e-4,
        "warmup": 50,
        "ckpt_every": args.ckpt_every,
        "config": asdict(cfg),
        "train_images": len(train_x),
    }
    t0 = time.perf_counter()
    model = train(cfg, recipe, train_x, train_y, run_dir)
    weights = save_module(
        model,
        cfg,
        out / WEIGHTS_FILE.name,
        dtype=torch.float32,
        recipe=recipe,
        data="Fashion-MNIST train (60k), 28x28 padded to 32x32, [0, 1]",
    )
    shipped, _ = load_fashion_net(weights)
    metrics = {
        "test": evaluate(shipped, test_x, test_y),
        "train_subset": evaluate(shipped, train_x[:10000], train_y[:10000]),
        "parameters": count_params(shipped),
        "feature_dim": cfg.feature_dim,
        "recipe": recipe,
        "weights_sha256": file_sha256(weights),
        "wall_time_s": round(time.perf_counter() - t0, 1),
        "command": "python scripts/train_fmnist_classifier.py" + (" --quick" if args.quick else ""),
    }
    write_json(metrics, out / METRICS_FILE.name)
    print(
        f"test accuracy {metrics['test']['accuracy']:.4f}, cross-entropy {metrics['test']['cross_entropy']:.4f}; "
        f"wrote {weights} and {out / METRICS_FILE.name}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
