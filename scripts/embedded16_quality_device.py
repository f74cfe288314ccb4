"""The embedded-16 quality grid in one process with a time budget, for a short GPU lease.

    PYTHONPATH=. python3 scripts/embedded16_quality_device.py N BATCH DEVICE OUT BUDGET_S [RUNS]
    # e.g. 500 500 cuda $OUT 265: AR, EAGLE-2 and LANTERN (k = 1000; δ 0.1, 0.4, 0.2, 0.05, in that order)
    # -> RUNS/<method>/ (lantern.generate runs; default /tmp/g) and OUT/<method>.tgz (without the drafts tables)

What ``bash scripts/embedded16_study.sh quality`` runs as separate commands, here in one Python process
(CUDA starts once) under a budget of BUDGET_S seconds for the decoding: a method that would overrun is
stopped and left out, later ones are skipped. Then the target's scores of every finished run
(:func:`lantern.run_reader.target_scores`: NLL and class consistency, ten teacher-forced passes an
image) are computed on DEVICE into ``<run>/target_scores.csv``, and each run is packed without its
drafts tables (tens of MB at 500 images), small enough to bring back. Score the unpacked directory
with ``python scripts/session_scores.py DIR --model embedded-16 --reuse-target-scores`` and
``python -m lantern.evaluate`` on the image folders. Sampling as the paper's: CFG 3, top-k 2000,
temperature 1; float32 as on the CPU; same seeds and classes for every method, so images are paired.
"""

import os
import signal
import sys
import tarfile
import time

import pandas as pd
import torch

from ambiguity.models.registry import load_model
from lantern.generate import main as generate
from lantern.run_reader import target_scores


class Late(Exception):
    pass


def late(*_):
    raise Late()


def main(n: int, batch: int, device: str, out: str, budget: float, runs_dir: str = "/tmp/g") -> None:
    common = ["--model", "embedded-16", "--num-images", str(n), "--batch-size", str(batch), "--cfg", "3"]
    common += ["--top-k", "2000", "--temperature", "1", "--dtype", "float32", "--device", device, "--no-progress"]
    tree = ["--tree", "dynamic"]
    runs = [("ar", ["--method", "ar"]), ("eagle2", ["--method", "sd", *tree])]
    for d in (0.1, 0.4, 0.2, 0.05):
        runs.append((f"lantern-k1000-d{d}", ["--method", "lantern", "--k", "1000", "--delta", str(d), *tree]))
    signal.signal(signal.SIGALRM, late)
    t0, done = time.time(), []
    for name, extra in runs:
        left = budget - (time.time() - t0)
        if left < 5:
            print(f"{name}: skipped, budget spent", flush=True)
            continue
        signal.alarm(int(left))
        t = time.time()
        try:
            rc = generate(common + extra + ["--out", f"{runs_dir}/{name}"])
            if rc in (0, None):
                done.append(name)
        except Late:
            rc = "timeout"
        except SystemExit as e:
            rc = e.code
        signal.alarm(0)
        print(f"== {name}: rc={rc} {time.time() - t:.1f}s", flush=True)
    model = load_model("embedded-16", device=torch.device(device), dtype=torch.float32)
    for name in done:
        d, t = f"{runs_dir}/{name}", time.time()
        target_scores(model, pd.read_parquet(f"{d}/images.parquet")).to_csv(f"{d}/target_scores.csv", index=False)
        print(f"target scores {name}: {time.time() - t:.1f}s", flush=True)
        with tarfile.open(f"{out}/{name}.tgz", "w:gz") as tf:
            for f in ("run.json", "summary.json", "steps.parquet", "images.parquet", "target_scores.csv", "grid.png"):
                if os.path.exists(f"{d}/{f}"):
                    tf.add(f"{d}/{f}", arcname=f"{name}/{f}")
            tf.add(f"{d}/images", arcname=f"{name}/images")
    print(f"total {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) not in (6, 7):
        print("error: usage: embedded16_quality_device.py N BATCH DEVICE OUT BUDGET_S [RUNS]", file=sys.stderr)
        sys.exit(2)
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]), *sys.argv[6:])
