"""Writes notebooks/paper.ipynb from the cells below, and with ``--execute`` runs it to fill in the outputs.

    python notebooks/make_paper.py --execute     # needs the `notebooks` extra (jupyter) for the kernel
The notebook shows a ``python -m lantern.paper`` run: ``runs/paper/default`` when it exists, else
``runs/paper/quick`` (which it regenerates with ``--quick`` settings when absent, < 10 min on 2
CPU cores). ``LANTERN_PAPER_RUN=DIR`` picks another run. tests/test_paper.py executes these cells.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbtools  # noqa: E402

CELLS = [
    ("markdown", """# LANTERN, regenerated

Every figure and table of the LANTERN paper (Jang et al., ICLR 2025, arXiv 2410.03355) that
`python -m lantern.paper` regenerates, next to the paper's published values. This notebook only
*reads* a run directory; regenerate with

```bash
python -m lantern.paper            # full size: the embedded model and its text twin (about an hour on 2 CPU cores)
python -m lantern.paper --quick    # a few images per measurement (< 10 min), every item marked QUICK
python -m lantern.paper --models llamagen-t2i-stage1,text-twin --weights llamagen-t2i-stage1=/ckpt --device cuda
```"""),
    ("code", """import os
from pathlib import Path

import pandas as pd
from IPython.display import Image, Markdown, display

from ambiguity.runs import RunOptions
from lantern.paper import run_paper
from lantern.paper.config import QUICK, PaperConfig
from lantern.paper.report import compact

ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
RUN = Path(os.environ.get("LANTERN_PAPER_RUN", ROOT / "runs" / "paper" / "default"))
if not (RUN / "report.md").is_file():
    RUN = ROOT / "runs" / "paper" / "quick"
    if not (RUN / "report.md").is_file():
        run_paper(PaperConfig(**QUICK), RunOptions(out=RUN, progress=False))


def show(name: str, width: int = 640) -> None:
    \"\"\"An item's figures and its tables (as the report shows them; the CSVs keep every column).\"\"\"
    folder = RUN / name
    for png in sorted(folder.glob("*.png")):
        display(Image(filename=str(png), width=width))
    for csv in sorted(folder.glob(f"{name}_*.csv")):
        display(Markdown(f"**{csv.stem}**"))
        display(compact(pd.read_csv(csv)))


report = (RUN / "report.md").read_text()
display(Markdown(report.split("\\n## ")[0]))
print("run:", RUN.relative_to(ROOT) if RUN.is_relative_to(ROOT) else RUN)"""),
    ("markdown", """## Fig. 2 — token selection ambiguity
(a) mean accepted length of lossless speculative decoding with the EAGLE-2 tree, image vs text
models; (b) drafter test accuracy per epoch and a random-initialised drafter; (c) average top-1
probability and top-10 mass."""),
    ("code", """show("fig2a")"""),
    ("code", """show("fig2b")"""),
    ("code", """show("fig2c")"""),
    ("markdown", """## Fig. 3 — latent interchangeability, and Fig. 4 — samples over δ and k"""),
    ("code", """show("fig3")"""),
    ("code", """show("fig4", width=420)"""),
    ("markdown", """## Fig. 5 and Tables 2-3 — speed against quality
Speed-ups are ratios of total (mean) latencies, AR / method, as the paper reports them, timed
interleaved after a warm-up; `per_image_speedup`, the median [quartiles] of the per-image ratios,
gives the spread; τ is the mean accepted length with the bonus token; quality against the
real images with 95 % intervals (jackknife; Wilson for precision)."""),
    ("code", """show("fig5")"""),
    ("code", """show("table2")"""),
    ("code", """show("table3")"""),
    ("markdown", """## Appendix F and the distortion of the relaxed rule"""),
    ("code", """show("f1")"""),
    ("code", """show("f2")"""),
    ("code", """show("distortion")"""),
    ("markdown", """Every table is a CSV for pandas, e.g. speed against FID at temperature 1:"""),
    ("code", """t2 = pd.read_csv(RUN / "table2" / "table2_ours.csv")
t2[t2.temperature == 1][["method", "tau", "tokens_per_forward", "speedup", "per_image_speedup",
                         "per_image_speedup_q25", "per_image_speedup_q75"]
                        + [c for c in t2.columns if c.startswith("fid_") and not c.endswith(("_lo", "_hi"))]]"""),
]


def build() -> dict:
    return nbtools.build(CELLS)


if __name__ == "__main__":
    nbtools.write(Path(__file__).with_name("paper.ipynb"), CELLS, execute="--execute" in sys.argv)
