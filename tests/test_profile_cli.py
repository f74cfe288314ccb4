"""python -m ambiguity.profile end to end on a tiny random model (4 x 4 tokens, 64 codes, 8 x 8 px)."""

import gzip
import json
import math
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import ambiguity.profile as prof
from ambiguity.conditions import ImageFiles, fashion_mnist_subset
from ambiguity.errors import UsageError
from ambiguity.models.checkpoints import save_module
from ambiguity.models.embedded import GPT_FILE, VQ_FILE, load_embedded
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.llamagen import LlamaGenModel
from ambiguity.models.vq import VQConfig, VQModel
from ambiguity.profile import STAT_COLUMNS, main, profile_forced, profile_model
from ambiguity.runs import RunOptions
from ambiguity.sampling import SamplingConfig

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ["top1_distribution", "top1_by_position", "images"]


def _tiny_gpt(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=64, block_size=16, num_classes=10, multiple_of=32, **kw)
    gpt = GPT(cfg)
    torch.nn.init.normal_(gpt.output.weight, std=0.5)  # the official zero init gives uniform distributions
    return gpt


def _tiny_vq() -> VQModel:
    torch.manual_seed(1)
    return VQModel(
        VQConfig(
            codebook_size=64,
            codebook_embed_dim=4,
            encoder_ch_mult=[1, 2],
            decoder_ch_mult=[1, 2],
            z_channels=32,
            ch=32,
            num_res_blocks=1,
            in_channels=1,
        )
    )


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("weights")
    gpt, vq = _tiny_gpt(), _tiny_vq()
    save_module(gpt, gpt.config, d / GPT_FILE)
    save_module(vq, vq.config, d / VQ_FILE)
    return d


@pytest.fixture(scope="module")
def model(weights):
    return load_embedded(weights)


def _run(weights, out, *extra, figures=False):
    return main(
        [
            "--weights",
            str(weights),
            "--out",
            str(out),
            "--no-progress",
            "--num-images",
            "6",
            "--batch-size",
            "4",
            *extra,
        ]
        + ([] if figures else ["--no-figures"])
    )


def _leftovers(out: Path):
    return [p.name for p in out.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]


def test_cli_writes_consistent_outputs(weights, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run(weights, out, "--cfg", "1", figures=True) == 0
    printed = capsys.readouterr().out
    assert "top-1 probability" in printed and str(out) in printed
    for f in ["tokens.parquet", "summary.json"] + [f"{n}.{x}" for n in FIGURES for x in ("png", "pdf")]:
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    assert (out / "run.json").is_file()
    assert sorted(p.name for p in (out / "parts").iterdir()) == [
        "batch_00000.json",
        "batch_00000.tokens.parquet",
        "batch_00001.json",
        "batch_00001.tokens.parquet",
    ]
    assert _leftovers(out) == []
    df = pd.read_parquet(out / "tokens.parquet")
    assert len(df) == 6 * 16
    assert {"image", "label", "condition", "position", "row", "col", "token", *STAT_COLUMNS} <= set(df.columns)
    assert df["image"].tolist() == [i for i in range(6) for _ in range(16)]
    assert df["label"].tolist()[::16] == [0, 1, 2, 3, 4, 5]  # default conditions: classes round-robin
    assert df["condition"].iloc[16] == "Trouser"
    assert (df["row"] * 4 + df["col"] == df["position"]).all()
    # cfg 1: the conditional-only distribution is the guided one
    for s in ("top1", "top10", "entropy", "chosen_prob", "chosen_rank"):
        assert (df[f"cond_{s}"] == df[f"guided_{s}"]).all(), s
    assert (df["guided_top10"] >= df["guided_top1"]).all()
    assert (df["guided_top1"] >= df["guided_chosen_prob"]).all()
    assert df["guided_entropy"].between(0, math.log(64) + 1e-5).all()
    assert (df["guided_chosen_rank"] >= 1).all() and (df["guided_chosen_rank"] <= 64).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens"] == 96 and summary["images"] == 6 and summary["seed"] == 0
    assert summary["sampling"] == {"guidance": 1.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    assert summary["stats"]["guided_top1"]["mean"] == pytest.approx(df["guided_top1"].mean(), rel=1e-6)
    assert summary["stats"]["guided_top10"]["median"] == pytest.approx(df["guided_top10"].median(), rel=1e-6)
    assert summary["model"]["vocab_size"] == 64 and summary["model"]["grid"] == [4, 4]
    assert set(summary["versions"]) >= {"python", "torch", "numpy", "transformers", "faiss", "lantern-ambiguity"}
    assert summary["settings"]["weights"] == str(weights.resolve()) and summary["wall_time_s"] > 0


def test_greedy_guided_chooses_rank_one(weights, tmp_path):
    out = tmp_path / "greedy"
    assert _run(weights, out, "--cfg", "3", "--temperature", "0", "--classes", "2,7") == 0
    df = pd.read_parquet(out / "tokens.parquet")
    assert (df["guided_chosen_rank"] == 1).all()
    assert (df["guided_chosen_prob"] == df["guided_top1"]).all()
    assert (df["cond_top1"] != df["guided_top1"]).any()  # guidance changes the distribution
    assert df["label"].tolist()[::16] == [2, 7, 2, 7, 2, 7]
    s = json.loads((out / "summary.json").read_text())
    assert s["stats"]["guided_chosen_is_top1"]["mean"] == 1.0


def test_generated_statistics_equal_teacher_forcing_the_same_tokens(model):
    """The on_step statistics of generation equal a teacher-forced pass over the sampled tokens."""
    sampling = SamplingConfig(guidance=2.5, temperature=0.8, top_k=20, top_p=0.9)
    df, summary = profile_model(model, [1, 4, 9], sampling, batch_size=2, seed=3, options=RunOptions(progress=False))
    assert summary["batches"] == {"total": 2, "resumed": 0, "computed": 2}
    tokens = torch.tensor(df["token"].to_numpy(), dtype=torch.long).view(3, 16)
    forced = profile_forced(model, [1, 4, 9], tokens, sampling)
    for k in STAT_COLUMNS:
        got = torch.tensor(df[k].to_numpy()).view(3, 16)
        if k.endswith("rank"):
            assert torch.equal(got, forced[k].to(got.dtype)), k
        else:
            torch.testing.assert_close(got, forced[k].float(), atol=2e-5, rtol=1e-4, msg=k)
    # top-k 20 leaves at most 20 tokens: the chosen rank never exceeds it
    assert df["guided_chosen_rank"].max() <= 20
    again, _ = profile_model(model, [1, 4, 9], sampling, batch_size=2, seed=3, options=RunOptions(progress=False))
    pd.testing.assert_frame_equal(df, again)


def test_resume_skips_finished_batches(weights, tmp_path, monkeypatch, capsys):
    out = tmp_path / "resume"
    real = prof.profile_generated
    calls = []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(prof, "profile_generated", interrupted)
    assert _run(weights, out) == 130
    assert "rerun the same command" in capsys.readouterr().err
    assert (out / "parts" / "batch_00000.json").is_file()
    assert not (out / "parts" / "batch_00001.json").exists()
    assert not (out / "tokens.parquet").exists() and not (out / "summary.json").exists()
    assert _leftovers(out) == []

    calls.clear()
    monkeypatch.setattr(prof, "profile_generated", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    assert _run(weights, out) == 0
    assert len(calls) == 1  # only the unfinished batch was computed
    s = json.loads((out / "summary.json").read_text())
    assert s["batches"] == {"total": 2, "resumed": 1, "computed": 1}
    resumed = pd.read_parquet(out / "tokens.parquet")

    fresh = tmp_path / "fresh"
    monkeypatch.setattr(prof, "profile_generated", real)
    assert _run(weights, fresh) == 0
    pd.testing.assert_frame_equal(resumed, pd.read_parquet(fresh / "tokens.parquet"))


def test_other_settings_into_the_same_out_are_refused(weights, tmp_path, capsys):
    out = tmp_path / "mix"
    assert _run(weights, out) == 0
    before = (out / "tokens.parquet").read_bytes()
    capsys.readouterr()
    assert _run(weights, out, "--cfg", "2") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out {out}" in err and "--overwrite" in err and "guidance" in err
    assert (out / "tokens.parquet").read_bytes() == before
    assert _run(weights, out, "--cfg", "2", "--overwrite") == 0
    assert json.loads((out / "summary.json").read_text())["sampling"]["guidance"] == 2.0
    (out / "run.json").unlink()  # parts whose settings are unknown are not reused either
    capsys.readouterr()
    assert _run(weights, out, "--cfg", "2") == 2
    assert "settings are unknown" in capsys.readouterr().err


def test_the_default_cfg_and_the_same_explicit_cfg_are_one_run(weights, tmp_path, capsys):
    out = tmp_path / "same"
    assert _run(weights, out) == 0  # c2i default: cfg 4
    assert json.loads((out / "summary.json").read_text())["settings"]["guidance"] == 4.0
    capsys.readouterr()
    assert _run(weights, out, "--cfg", "4") == 0
    assert "0 computed" in capsys.readouterr().out.replace("batches computed", "computed")
    assert _run(weights, out, "--cfg", "3") == 2
    assert "guidance: 4.0 there, 3.0 now" in capsys.readouterr().err


def _bad_cases(tmp_path, weights):
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "no_weights").mkdir(exist_ok=True)
    w = ["--weights", str(weights)]
    cases = {
        "unknown model": ["--model", "no-such-model"],
        "absent embedded weights": ["--weights", str(tmp_path / "no_weights")],
        "absent llamagen weights": ["--model", "llamagen-c2i-b", "--weights", str(tmp_path / "no_weights")],
        "negative temperature": w + ["--temperature", "-1"],
        "top-p zero": w + ["--top-p", "0"],
        "top-p above one": w + ["--top-p", "1.5"],
        "negative top-k": w + ["--top-k", "-1"],
        "negative cfg": w + ["--cfg", "-0.5"],
        "zero images": w + ["--num-images", "0"],
        "negative images": w + ["--num-images", "-3"],
        "zero batch": w + ["--batch-size", "0"],
        "missing captions": w + ["--captions", str(tmp_path / "nope.txt")],
        "empty captions": w + ["--captions", str(tmp_path / "empty.txt")],
        "captions for a c2i model": w + ["--captions", str(ROOT / "README.md")],
        "bad classes": w + ["--classes", "a,b"],
        "class out of range": w + ["--classes", "3,12"],
        "dataset without images": w + ["--source", "dataset", "--data", str(tmp_path / "no_weights")],
        "images dir missing": w + ["--source", "dataset", "--images", str(tmp_path / "nope")],
        "images without dataset source": w + ["--images", str(tmp_path)],
        "bad dtype": w + ["--dtype", "int8"],
    }
    if not torch.cuda.is_available():
        cases["cuda without cuda"] = w + ["--device", "cuda"]
    return cases


def test_bad_input_exits_2_with_one_line_and_writes_nothing(weights, tmp_path, capsys):
    for name, argv in _bad_cases(tmp_path, weights).items():
        out = tmp_path / "out" / re.sub(r"\W", "_", name)
        rc = main(argv + ["--out", str(out), "--no-progress"])
        err = capsys.readouterr().err.strip()
        assert rc == 2, name
        assert len(err.splitlines()) == 1 and err.startswith("error: "), (name, err)
        assert not out.exists(), name


def test_unwritable_out_exits_2(weights, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for out in (blocker, blocker / "sub"):
        assert main(["--weights", str(weights), "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--out" in err
    assert blocker.read_text() == "x"


def test_argparse_errors_exit_2(capsys):
    assert main(["--num-images", "many"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_subprocess_error_is_one_line_without_traceback(weights, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ambiguity.profile",
            "--weights",
            str(weights),
            "--temperature",
            "-1",
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == "error: --temperature must be a finite number >= 0 (0 is greedy), got -1.0"
    assert "Traceback" not in r.stdout + r.stderr
    assert not (tmp_path / "x").exists()


def test_dataset_source_teacher_forces_image_files(weights, model, tmp_path):
    from PIL import Image

    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, size in enumerate([(12, 10), (8, 8), (20, 9), (9, 15), (16, 16)]):
        arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(arr).save(folder / ("sub" if i % 2 else "") / f"{i:012d}.png")
    (folder / "notes.txt").write_text("not an image")
    out = tmp_path / "ds"
    rc = main(
        [
            "--weights",
            str(weights),
            "--out",
            str(out),
            "--no-progress",
            "--source",
            "dataset",
            "--images",
            str(folder),
            "--num-images",
            "4",
            "--batch-size",
            "3",
            "--classes",
            "5",
            "--cfg",
            "1.5",
            "--no-figures",
        ]
    )
    assert rc == 0
    df = pd.read_parquet(out / "tokens.parquet")
    assert len(df) == 4 * 16 and (df["label"] == 5).all()
    files = sorted(p for p in folder.rglob("*.png"))
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(0))[:4].tolist()
    codes = model.encode_images(ImageFiles([files[i] for i in order], model.image_shape)[0:4]).reshape(4, 16)
    assert df["token"].tolist() == codes.reshape(-1).tolist()
    assert json.loads((out / "summary.json").read_text())["source"] == "dataset"


def _write_idx(path: Path, arr: np.ndarray):
    header = struct.pack(">I", 0x0800 | arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    with gzip.open(str(path) + ".gz", "wb") as fh:
        fh.write(header + arr.astype(np.uint8).tobytes())


def test_fashion_mnist_subset_uses_true_labels(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.arange(30) % 10
    images = rng.integers(0, 256, (30, 28, 28))
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", images)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels)

    class Stub:
        name, kind, num_classes, image_shape = "stub", "c2i", 10, (1, 32, 32)

    x, y = fashion_mnist_subset(Stub(), 4, seed=0, classes=[3, 7], data=tmp_path)
    assert x.shape == (4, 1, 32, 32) and set(y) <= {3, 7}
    keep = np.flatnonzero(np.isin(labels, [3, 7]))
    idx = keep[torch.randperm(len(keep), generator=torch.Generator().manual_seed(0))[:4].numpy()]
    assert y == labels[idx].tolist()
    assert torch.equal(x[:, 0, 2:30, 2:30], torch.from_numpy(images[idx]).float() / 255)
    with pytest.raises(UsageError, match="--num-images"):
        fashion_mnist_subset(Stub(), 7, seed=0, classes=[3, 7], data=tmp_path)


class HashCaptions:
    """A stand-in caption encoder: deterministic features from the caption's characters."""

    def __init__(self, P=4, D=16):
        self.P, self.D = P, D

    def encode(self, captions):
        feats = torch.stack(
            [
                torch.sin(torch.arange(self.P * self.D).float() * (1 + sum(map(ord, c)) % 7)).view(self.P, self.D)
                for c in captions
            ]
        )
        mask = torch.ones(len(captions), self.P, dtype=torch.bool)
        mask[0, 0] = False  # one padded caption exercises the masked path
        return feats, mask


def test_t2i_model_profiles_captions(tmp_path):
    gpt = _tiny_gpt(model_type="t2i", caption_dim=16, cls_token_num=4)
    model = LlamaGenModel(gpt, None, name="tiny-t2i", caption_encoder=HashCaptions())
    caps = tmp_path / "caps.txt"
    caps.write_text("a red bus\n\na small dog\na cat on a mat\n")
    from ambiguity.conditions import generation_conditions

    conds = generation_conditions(model, 3, seed=0, captions=caps)
    assert sorted(conds) == ["a cat on a mat", "a red bus", "a small dog"]
    df, summary = profile_model(model, conds, num_images=3, batch_size=2, options=RunOptions(progress=False))
    assert summary["sampling"]["guidance"] == 7.5  # LlamaGen's t2i default
    assert df["condition"].tolist()[::16] == conds and (df["label"] == -1).all()
    assert (df["cond_top1"] != df["guided_top1"]).any()
    with pytest.raises(UsageError, match="--captions"):
        generation_conditions(model, 3, seed=0)


def test_t2i_image_files_get_their_coco_captions(tmp_path):
    from PIL import Image

    from ambiguity.conditions import image_files_subset

    model = LlamaGenModel(
        _tiny_gpt(model_type="t2i", caption_dim=16, cls_token_num=4),
        _tiny_vq(),
        name="tiny-t2i",
        caption_encoder=HashCaptions(),
    )
    folder = tmp_path / "val2014"
    folder.mkdir()
    for i in (3, 9, 42):
        Image.new("RGB", (10, 12), (i, 2 * i, 3 * i)).save(folder / f"COCO_val2014_{i:012d}.jpg")
    coco = {
        "annotations": [
            {"image_id": 9, "caption": "a dog"},
            {"image_id": 3, "caption": "a red bus"},
            {"image_id": 9, "caption": "a brown dog"},
            {"image_id": 7, "caption": "no such file"},
        ]
    }
    (tmp_path / "captions_val2014.json").write_text(json.dumps(coco))
    files, caps = image_files_subset(model, folder, 2, seed=0, captions=tmp_path / "captions_val2014.json")
    pairs = {f.name: c for f, c in zip(files.paths, caps)}
    assert pairs == {"COCO_val2014_000000000003.jpg": "a red bus", "COCO_val2014_000000000009.jpg": "a brown dog"}
    x = files[0:2]
    assert x.shape == (2, 1, 8, 8) and 0 <= x.min() and x.max() <= 1
    with pytest.raises(UsageError, match="--num-images"):
        image_files_subset(model, folder, 3, seed=0, captions=tmp_path / "captions_val2014.json")


def test_readme_quick_start_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = 'pip install torch==2.13.0 && pip install -e ".[dev]" && python -m pytest -q'
    assert test_cmd in readme
    # CI: the same install and test command, with the linter and the formatter check in between
    install, tests = test_cmd.split(" && python")
    lint = ci.index("ruff check .\nruff format --check .\n")
    assert ci.index(install) < lint < ci.index("python" + tests)
    assert "pip install torch==2.13.0 && pip install -e . && python -m ambiguity.profile" in readme
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


def test_plots_image_grid_with_row_labels_saves_png_and_pdf(tmp_path):
    from ambiguity import plots

    imgs = torch.linspace(0, 1, 6 * 3 * 8 * 8).view(6, 3, 8, 8)
    fig = plots.image_grid(imgs, ncol=3, row_labels=["neighbour", "random"], title="t")
    paths = plots.save_figure(fig, tmp_path / "grid.png")
    assert [p.name for p in paths] == ["grid.png", "grid.pdf"]
    assert (tmp_path / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "grid.pdf").read_bytes()[:5] == b"%PDF-"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.pdf", "grid.png"]  # no temporary files left
    first = {p.name: p.read_bytes() for p in paths}
    plots.save_figure(fig, tmp_path / "grid.png")  # no creation date: regenerating changes no byte
    assert {p.name: p.read_bytes() for p in paths} == first and b"CreationDate" not in first["grid.pdf"]
    with pytest.raises(ValueError, match="row labels"):
        plots.image_grid(imgs, ncol=3, row_labels=["only one"])
    with pytest.raises(ValueError, match="C, H, W"):
        plots.image_grid(torch.zeros(2, 2, 8, 8))


@pytest.mark.parametrize("name", ["embedded", "text-twin"])
def test_registered_kind_is_the_loaded_models_kind(name):
    from ambiguity.models.registry import get_spec, load_model

    assert load_model(name, device="cpu").kind == get_spec(name).kind


def test_readme_profile_examples_run_one_after_the_other(tmp_path, monkeypatch, capsys):
    """The README's two embedded examples (generated, then ``--source dataset``) run in a row with
    their default ``--out``: each source has its own folder, so the second is not refused."""
    import sys as _sys

    _sys.path.insert(0, str(ROOT / "tests"))
    from fake_data import write_fake_fashion_mnist

    data = write_fake_fashion_mnist(tmp_path / "fm", 0, 10)
    monkeypatch.chdir(tmp_path)
    common = ["--no-progress", "--num-images", "2", "--no-figures"]  # the shipped embedded model
    assert main(common) == 0
    assert main(common + ["--source", "dataset", "--data", str(data)]) == 0, capsys.readouterr().err
    gen = json.loads((tmp_path / "runs/profile/embedded/summary.json").read_text())
    forced = json.loads((tmp_path / "runs/profile/embedded-dataset/summary.json").read_text())
    assert (gen["source"], forced["source"]) == ("generate", "dataset")
