"""Writes notebooks/quickstart.ipynb from the cells below (keeps the notebook reviewable as code).

    python notebooks/make_quickstart.py --execute   # rewrite the .ipynb and fill in the outputs (about 1.5 min)

(``--execute`` needs ``pip install nbclient ipykernel``; run it from the repository root with
``PYTHONPATH=$PWD`` and no ``MPLBACKEND`` so the figures are drawn inline.) The committed notebook
must keep its outputs: tests/test_notebook.py fails on code cells without them.
The test suite executes these cells (tests/test_notebook.py), so the notebook keeps working.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbtools  # noqa: E402

CELLS = [
    ("markdown", """# Token-selection ambiguity and LANTERN decoding — quick start

Everything here runs on a laptop CPU with the embedded model (LlamaGen-architecture VQ tokenizer +
class-conditional GPT trained on Fashion-MNIST, shipped with the package). Swap
`load_model("embedded")` for `load_model("llamagen-c2i-l", weights=...)`, `load_model("anole")`, ...
on a GPU machine with your checkpoints; every call below takes any model behind the protocol."""),
    ("code", """import pandas as pd
import torch

import ambiguity as amb
import lantern as lt

model = amb.load_model("embedded", device="auto")
model.describe()"""),
    ("markdown", """## 1. How ambiguous are the next-token distributions?
`profile_model` samples images and records, at every token, the top-1 probability, top-10 mass, entropy
(nats) and the chosen token's probability and rank — for the guided (CFG) and the conditional-only
distribution. Image `i` draws from its own random stream seeded by `(seed, i)`."""),
    ("code", """sampling = amb.SamplingConfig(guidance=4.0, temperature=1.0)
table, summary = amb.profile_model(model, sampling=sampling, num_images=16, batch_size=16, options=amb.RunOptions(progress=False))
table[["guided_top1", "guided_top10", "guided_entropy", "cond_top1", "cond_top10"]].describe().round(3)"""),
    ("code", """import matplotlib.pyplot as plt
import seaborn as sns

grid = table.groupby(["row", "col"]).guided_top1.mean().unstack()
ax = sns.heatmap(grid, annot=True, fmt=".2f", cmap="viridis", square=True, cbar_kws={"label": "mean top-1 probability"})
ax.set(title="mean top-1 probability per token position", xlabel="token column", ylabel="token row");"""),
    ("markdown", """## 2. Latent neighbourhoods
`B_k(x)`: the k nearest codebook vectors of every code (FAISS, exact, cached on disk).
Concentration: how much of the target's probability falls inside `B_k(top-1)` compared with k random
tokens and with the best possible k tokens."""),
    ("code", """nb = amb.model_neighbourhoods(model, k=16, metric="l2")
print(nb.indices.shape, "neighbours of code 0:", nb.indices[0, :8].tolist())
positions, conc = amb.run_concentration(model, ks=[1, 4, 16, 64], num_images=8, batch_size=8, options=amb.RunOptions(progress=False))
conc.pivot(index="k", columns="set", values="mean").round(4)   # mean target mass of each k-token set"""),
    ("markdown", """## 3. LANTERN decoding
Draft γ tokens with the shipped EAGLE drafter, verify with the target, accept losslessly (`sd`) or with
LANTERN's relaxed rule (`lantern`: TVD bound δ over the k latent neighbours).
Mean accepted length counts the bonus token (EAGLE's τ); step compression = tokens / target forwards."""),
    ("code", """drafter = lt.load_drafter(model)
classes = list(range(10))
runs = {}
for method, delta in [("ar", 0.0), ("sd", 0.0), ("lantern", 0.1), ("lantern", 0.4)]:
    config = lt.DecodeConfig.of(method, gamma=4, k=64, delta=delta)
    runs[f"{method} δ={delta}"] = lt.decode(model, classes, config, sampling, drafter=drafter, pixels=True)
print(lt.summary_table([r.summary() for r in runs.values()], extra=["delta"]))"""),
    ("code", """images = torch.cat([r.pixels for r in runs.values()])
amb.plots.image_grid(images, ncol=10, row_labels=list(runs), title="same seeds and classes, per decoding method")"""),
    ("code", """steps, drafts, _ = runs["lantern δ=0.4"].frames()
drafts.groupby(pd.cut(drafts.p_top1, [0, .1, .2, .4, .6, 1.0])).committed.mean().rename("acceptance rate by top-1 of p")"""),
]


def build() -> dict:
    return nbtools.build(CELLS)


if __name__ == "__main__":
    nbtools.write(Path(__file__).with_name("quickstart.ipynb"), CELLS, execute="--execute" in sys.argv)
