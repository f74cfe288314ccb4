"""One-command GPU check: CUDA tests, decoding latency and batched throughput at LlamaGen-XL shapes.

    python benchmarks/gpu_check.py              # on a GPU machine, < 8 min
    python benchmarks/gpu_check.py --smoke      # anywhere: tiny shapes, GPU parts skipped

What it runs (random weights: latency does not depend on trained weights, so nothing is
downloaded):

1. the CUDA-marked tests (``pytest -m cuda``), skipped with a note when no GPU is visible;
2. batch-1 latency per image of AR, a LANTERN chain (γ = 4) and a LANTERN EAGLE-2 dynamic tree
   on a LlamaGen GPT-XL-shaped target (36 layers, 1280 wide, 16384 codes, 16 x 16 tokens, CFG 4)
   with an EAGLE drafter of the same shapes (``--smoke``: a 2-layer, 64-wide model with 256 codes
   and 8 x 8 tokens);
3. batched throughput (images/s) of AR and the LANTERN chain at B in ``--batch-sizes``
   (:func:`lantern.engine.decode.decode` with ``batch_size``);
4. what a verify forward costs in AR forwards (``bench_round_cost.py``'s ``verify_cost``, issue 41): the
   target's forward with its distribution at 1, 5 (a chain of γ = 4) and 16 (an SJD window) tokens a row
   and one drafter step, per B (:func:`lantern.engine.policy.measure_costs`: interleaved, the least of 7),
   and the bounds they put on a speed-up over AR at the τ measured on ``embedded-16``
   (:data:`TAU`; random weights accept nothing worth reporting): ``tau * t(1) / t(T)``, and for the
   chain with its four drafter steps paid ``tau * t(1) / (t(5) + 4 step)``. On this repository's CPU the
   5-token forward costs 1.6-3.3 AR forwards (``benchmarks/results/round_cost.csv``);
5. FAISS kNN (k = 64) over a random 16384 x 8 codebook on the GPU (``faiss.StandardGpuResources``),
   skipped with a note when faiss has no GPU support.

Writes a JSON report (``--out``) and prints one line per measurement; every skipped part says why.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks.common

from ambiguity.cli import ArgumentParser, add_device_args, cli_main, device_from_args, int_list, positive_int
from ambiguity.models.gpt import GPT, GPTConfig, gpt_config_from_official
from ambiguity.models.llamagen import LlamaGenModel
from ambiguity.sampling import SamplingConfig
from benchmarks.common import ROOT, add_results_arg
from lantern.drafter.model import Drafter
from lantern.engine.decode import DecodeConfig, decode
from lantern.engine.policy import measure_costs
from lantern.methods.tree.spec import TreeSpec


def random_target(smoke: bool, device: torch.device, dtype: torch.dtype) -> LlamaGenModel:
    """A LlamaGen GPT with random weights: GPT-XL c2i 256 px shapes, or a tiny one for ``smoke``."""
    if smoke:
        config = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=256, block_size=64, num_classes=10, multiple_of=32)
    else:
        config = gpt_config_from_official(
            preset="GPT-XL", model_type="c2i", block_size=256, vocab_size=16384, num_classes=1000, cls_token_num=1
        )
    torch.manual_seed(0)
    gpt = GPT(config)
    torch.nn.init.normal_(gpt.output.weight, 0.0, 0.02)  # the official init zeroes the head (uniform logits)
    return LlamaGenModel(gpt.to(device, dtype).eval(), None, name="llamagen-xl-random" if not smoke else "tiny-random")


def random_table(V: int, k: int, device: torch.device) -> torch.Tensor:
    """(V, k) nearest codes of a random V x 8 codebook (squared L2, self excluded), computed in blocks."""
    g = torch.Generator().manual_seed(1)
    book = torch.randn(V, 8, generator=g).to(device)
    rows = []
    for block in book.split(4096):
        d = torch.cdist(block, book)
        rows.append(d.topk(k + 1, largest=False).indices[:, 1:])
    return torch.cat(rows)


# tokens an image commits per round on embedded-16 at B = 1 (benchmarks/results/round_cost.csv, the paper's
# sampling): a LANTERN chain of γ = 4 (k 1000 mapped, δ 0.1) and SJD with a window of 16
TAU = {"lantern_chain_4": 3.4, "sjd_window_16": 2.7}


def verify_costs(model, drafter, sampling: SamplingConfig, sizes: list[int]) -> dict:
    """Part 4 of the module docstring: {B: milliseconds of the forward at 1, 5 and 16 tokens a row and of
    a drafter step, the costs t(T) / t(1) and the bounds at :data:`TAU`}."""
    costs = measure_costs(model, drafter, sampling, sizes, (1, 5, 16))
    g, out = 1 + sampling.guided, {}
    for B in sizes:
        t = {T: costs["target"][f"{B * g},{T}"] for T in (1, 5, 16)}
        step = costs["drafter"][f"{B * g},1"]
        out[B] = {
            **{f"ms_{T}_tokens": 1e3 * t[T] for T in t},
            "ms_drafter_step": 1e3 * step,
            "cost_5": t[5] / t[1],
            "cost_16": t[16] / t[1],
            "bound_lantern": TAU["lantern_chain_4"] * t[1] / t[5],
            "bound_lantern_with_drafter": TAU["lantern_chain_4"] * t[1] / (t[5] + 4 * step),
            "bound_sjd": TAU["sjd_window_16"] * t[1] / t[16],
        }
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return out


def cuda_tests() -> dict:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device visible"}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests"], cwd=ROOT, capture_output=True, text=True
    )
    tail = (proc.stdout or proc.stderr).strip().splitlines()[-1:] or [""]
    return {"returncode": proc.returncode, "result": tail[0], "seconds": round(time.perf_counter() - t0, 1)}


def faiss_knn(V: int = 16384, k: int = 64) -> dict:
    try:
        import faiss
    except ImportError:
        return {"skipped": "faiss is not installed"}
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
        return {"skipped": "faiss has no GPU support here (faiss-cpu build or no GPU)"}
    import numpy as np

    book = np.random.default_rng(0).standard_normal((V, 8)).astype("float32")
    res = faiss.StandardGpuResources()
    index = faiss.GpuIndexFlatL2(res, 8)
    index.add(book)
    index.search(book[:16], k + 1)  # warm-up
    t0 = time.perf_counter()
    _, idx = index.search(book, k + 1)
    seconds = time.perf_counter() - t0
    return {"codes": V, "k": k, "seconds": seconds, "self_first": float((idx[:, 0] == np.arange(V)).mean())}


@cli_main
def main(argv=None) -> int:
    ap = ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (runs on a CPU in seconds; GPU parts skipped)")
    add_device_args(ap, what="for the models; auto is cuda when visible, dtype bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--latency-images", type=positive_int, default=3, help="images per latency measurement (median)")
    ap.add_argument("--batch-sizes", default=None, help="default 1,8,32 (smoke: 1,4)")
    add_results_arg(ap, "gpu_check", "gpu_check.json", what="results file")
    args = ap.parse_args(argv)
    device, dtype = device_from_args(args)
    sizes = int_list(args.batch_sizes or ("1,4" if args.smoke else "1,8,32"), "--batch-sizes", 1)
    t_start = time.perf_counter()
    report: dict = {
        "device": str(device),
        "dtype": str(dtype),
        "smoke": args.smoke,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
    print(f"device {device} ({report['gpu'] or 'no GPU'}), {dtype}", flush=True)

    report["cuda_tests"] = cuda_tests() if not args.smoke else {"skipped": "--smoke"}
    print(f"CUDA tests: {report['cuda_tests']}", flush=True)

    model = random_target(args.smoke, device, dtype)
    drafter = Drafter.for_target(model, seed=0).eval()
    k = 64 if not args.smoke else 8
    table = random_table(model.vocab_size, k, device)
    sampling = SamplingConfig(guidance=4.0, temperature=1.0)
    configs = {
        "ar": DecodeConfig.of("ar"),
        "lantern-chain": DecodeConfig.of("lantern", 4, k=k, delta=0.2),
        "lantern-dynamic": DecodeConfig.of(
            "lantern",
            tree=TreeSpec(
                "dynamic",
                total_tokens=59 if not args.smoke else 10,
                depth=4 if not args.smoke else 2,
                top_k=10 if not args.smoke else 3,
            ),
            k=k,
            delta=0.2,
        ),
    }
    run = lambda cfg, n, B=1, first=0: decode(
        model,
        [i % (model.num_classes or 1) for i in range(n)],
        cfg,
        sampling,
        drafter if cfg.speculative else None,
        table,
        seed=0,
        first_index=first,
        batch_size=B,
    )
    latency = {}
    for name, cfg in configs.items():
        run(cfg, 1)  # warm-up
        secs = timed(lambda: run(cfg, 1), device, args.latency_images)
        latency[name] = {"seconds_per_image": statistics.median(secs), "min": min(secs), "max": max(secs)}
        print(f"latency {name:16s} {latency[name]['seconds_per_image']:.3f} s/image (batch 1)", flush=True)
    report["latency"] = latency

    throughput = {}
    for name in ("ar", "lantern-chain"):
        for B in sizes:
            n = max(2 * B, 2)
            run(configs[name], min(B, 2), B)  # warm-up at this batch
            secs = timed(lambda: run(configs[name], n, B), device, 1)[0]
            throughput[f"{name}@{B}"] = {"images": n, "images_per_s": n / secs}
            print(f"throughput {name:14s} B={B:3d} {n / secs:8.2f} images/s", flush=True)
    report["throughput"] = throughput

    report["verify_cost"] = verify_costs(model, drafter, sampling, sizes)
    for B, row in report["verify_cost"].items():
        print(
            f"verify B={B:3d}: 5 tokens {row['cost_5']:.2f}, 16 tokens {row['cost_16']:.2f} AR forwards; "
            f"bounds LANTERN {row['bound_lantern']:.2f} ({row['bound_lantern_with_drafter']:.2f} with its "
            f"drafter) at τ {TAU['lantern_chain_4']}, SJD {row['bound_sjd']:.2f} at τ {TAU['sjd_window_16']}",
            flush=True,
        )

    report["faiss_gpu_knn"] = (
        faiss_knn()
        if not args.smoke and device.type == "cuda"
        else {"skipped": "--smoke" if args.smoke else "no CUDA device"}
    )
    print(f"FAISS GPU kNN 16384 x 8: {report['faiss_gpu_knn']}", flush=True)
    report["wall_s"] = round(time.perf_counter() - t_start, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"done in {report['wall_s']} s; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
