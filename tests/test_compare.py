"""``python -m ambiguity.compare``: bootstrap CIs, argument checks, and the CLI on two tiny random models."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from ambiguity import compare as cmp
from ambiguity.cli import parse_mapping
from ambiguity.errors import UsageError
from ambiguity.io import save_tensors
from ambiguity.models.checkpoints import save_module
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.text_twin import HELDOUT_FILE, TOKENIZER_FILE, TWIN_FILE, twin_config
from ambiguity.models.vq import VQConfig, VQModel


# --------------------------------------------------------------------------- bootstrap
def test_bootstrap_of_constant_values_is_degenerate():
    assert cmp.bootstrap_ci(np.full(7, 0.25), n_boot=50, seed=3) == (0.25, 0.25, 0.25)


def test_bootstrap_two_images_exact_quantiles():
    # Resampled means of {0, 1} are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4; with 4000
    # resamples the empirical shares are within +-0.03 of those, far from every quantile edge.
    mean, lo, hi = cmp.bootstrap_ci(np.array([0.0, 1.0]), n_boot=4000, seed=0, level=0.95)
    assert (mean, lo, hi) == (0.5, 0.0, 1.0)
    assert cmp.bootstrap_ci(np.array([0.0, 1.0]), n_boot=4000, seed=0, level=0.4) == (0.5, 0.5, 0.5)


def test_bootstrap_is_seeded_and_follows_the_documented_recipe():
    v = np.array([0.1, 0.2, 0.6])
    # default_rng(3).integers(0, 3, (5, 3)) drawn by hand once: the five resampled means
    idx = np.random.default_rng(3).integers(0, 3, size=(5, 3))
    means = v[idx].mean(axis=1)
    expect = (0.3, float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)))
    assert cmp.bootstrap_ci(v, n_boot=5, seed=3) == pytest.approx(expect, abs=1e-15)
    assert cmp.bootstrap_ci(v, n_boot=200, seed=1) == cmp.bootstrap_ci(v, n_boot=200, seed=1)
    assert cmp.bootstrap_ci(v, n_boot=200, seed=1) != cmp.bootstrap_ci(v, n_boot=200, seed=2)
    with pytest.raises(ValueError):
        cmp.bootstrap_ci(np.array([]))


def test_per_image_means_and_summary_row():
    table = pd.DataFrame(
        {
            "image": [0, 0, 1, 1],
            "guided_top1": [0.2, 0.4, 0.6, 0.6],
            "guided_top10": [0.5, 0.7, 0.9, 1.0],
            "guided_entropy": [2.0, 1.0, 0.5, 0.5],
            "cond_top1": [0.1, 0.1, 0.3, 0.3],
            "cond_top10": [0.4, 0.4, 0.8, 0.8],
            "cond_entropy": [3.0, 3.0, 1.0, 1.0],
        }
    )
    per = cmp.per_image_means(table)
    assert per["top1"].tolist() == pytest.approx([0.3, 0.6])
    assert per["cond_entropy"].tolist() == pytest.approx([3.0, 1.0])
    acc = pd.DataFrame(
        {"epoch": [0, 1, 2], "top1": [0.01, 0.2, 0.3], "top2": [0.02, 0.3, 0.4], "top3": [0.03, 0.4, 0.5]}
    )
    summary = {
        "model": {"kind": "c2i", "vocab_size": 8, "parameters": 10},
        "source": "generate",
        "sampling": {"guidance": 1.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0},
    }
    row = cmp.summary_row("m", table, summary, cmp.CompareSettings(n_boot=10), acc)
    assert row["top1"] == pytest.approx(0.45) and row["cond_top1"] == pytest.approx(0.2)
    assert (row["drafter_top1"], row["drafter_top3"], row["drafter_top1_random"], row["drafter_epochs"]) == (
        0.3,
        0.5,
        0.01,
        2,
    )
    assert row["top1_lo"] <= row["top1"] <= row["top1_hi"]


# --------------------------------------------------------------------------- arguments
def test_parse_models_and_mapping(tmp_path):
    assert cmp.parse_models("embedded, text-twin") == ["embedded", "text-twin"]
    with pytest.raises(UsageError, match="unknown model"):
        cmp.parse_models("embedded,not-a-model")
    with pytest.raises(UsageError, match="twice"):
        cmp.parse_models("embedded,embedded")
    models = ["embedded", "hf:org/repo"]
    assert parse_mapping([f"hf:org/repo={tmp_path}"], models) == {"hf:org/repo": tmp_path}
    for bad, msg in (
        ("embedded", "MODEL=PATH"),
        (f"anole={tmp_path}", "not in --models"),
        ("embedded=/no/such/dir", "does not exist"),
    ):
        with pytest.raises(UsageError, match=msg):
            parse_mapping([bad], models)


# --------------------------------------------------------------------------- CLI on tiny models
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ambiguity.data import text_corpus as tc

    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    image = GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=300, block_size=16, num_classes=10, multiple_of=32)
    gpt = GPT(image)
    for p in gpt.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    vq_cfg = VQConfig(
        codebook_size=300,
        codebook_embed_dim=4,
        encoder_ch_mult=[1, 2],
        decoder_ch_mult=[1, 2],
        z_channels=32,
        ch=32,
        num_res_blocks=1,
        in_channels=1,
    )
    (root / "emb").mkdir()
    save_module(gpt, image, root / "emb" / "fashion_gpt.safetensors")
    save_module(VQModel(vq_cfg), vq_cfg, root / "emb" / "fashion_vq.safetensors")
    twin = GPT(twin_config(image))
    for p in twin.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    (root / "twin").mkdir()
    save_module(twin, twin.config, root / "twin" / TWIN_FILE)
    tc.train_tokenizer(tc.synthetic_corpus(), 300).save(str(root / "twin" / TOKENIZER_FILE))
    held = torch.randint(0, 300, (6, 16), generator=torch.Generator().manual_seed(0))
    save_tensors({"tokens": held.to(torch.int16)}, root / "twin" / HELDOUT_FILE)
    acc = pd.DataFrame({"epoch": [0, 1], "top1": [0.05, 0.5], "top2": [0.1, 0.6], "top3": [0.15, 0.7]})
    acc.to_parquet(root / "acc.parquet")
    return root


def _args(tiny, out, *extra):
    return [
        "--models",
        "embedded,text-twin",
        "--weights",
        f"embedded={tiny / 'emb'}",
        "--weights",
        f"text-twin={tiny / 'twin'}",
        "--out",
        str(out),
        "--num-images",
        "4",
        "--batch-size",
        "2",
        "--bootstrap",
        "100",
        "--no-progress",
        "--drafter-accuracy",
        f"text-twin={tiny / 'acc.parquet'}",
        *extra,
    ]


@pytest.mark.slow  # ~6 s on an idle 2-core machine: two models, figures drawn twice
def test_cli_writes_table_and_figures_and_resumes(tiny, tmp_path, capsys, monkeypatch):
    out = tmp_path / "cmp"
    assert cmp.main(_args(tiny, out, "--cfg", "2.0")) == 0
    printed = capsys.readouterr().out
    assert "text-twin" in printed and "LlamaGen (paper)" in printed
    for f in (
        "compare.parquet",
        "per_image.parquet",
        "compare_ambiguity.png",
        "compare_ambiguity.pdf",
        "compare_drafter.png",
        "compare_drafter.pdf",
        "embedded/tokens.parquet",
        "text-twin/summary.json",
    ):
        assert (out / f).is_file(), f
    df = pd.read_parquet(out / "compare.parquet").set_index("model")
    assert list(df.index) == ["embedded", "text-twin"]
    assert df.loc["embedded", "guidance"] == 2.0 and df.loc["text-twin", "guidance"] == 1.0  # text: no guidance
    assert (df["images"] == 4).all() and df.loc["text-twin", "tokens"] == 4 * 16
    assert (df["top1_lo"] <= df["top1"]).all() and (df["top1"] <= df["top1_hi"]).all()
    assert (df["top1"] <= df["top10"]).all()
    assert df.loc["text-twin", "drafter_top1"] == 0.5 and np.isnan(df.loc["embedded", "drafter_top1"])
    # the CI is the documented seeded bootstrap of the per-image means
    per = pd.read_parquet(out / "per_image.parquet")
    for name in df.index:
        vals = per[per["model"] == name].sort_values("image")["top10"].to_numpy()
        assert cmp.bootstrap_ci(vals, 100, 0) == (
            df.loc[name, "top10"],
            df.loc[name, "top10_lo"],
            df.loc[name, "top10_hi"],
        )
    tokens = pd.read_parquet(out / "text-twin" / "tokens.parquet")
    assert tokens.groupby("image")["guided_top1"].mean().to_numpy() == pytest.approx(
        per[per["model"] == "text-twin"]["top1"].to_numpy()
    )

    # a rerun reads the finished models back without profiling them again
    def refuse(*a, **k):
        raise AssertionError("a finished model was profiled again")

    with monkeypatch.context() as m:
        m.setattr(cmp, "profile_model", refuse)
        assert cmp.main(_args(tiny, out, "--cfg", "2.0")) == 0
    again = pd.read_parquet(out / "compare.parquet").set_index("model")
    pd.testing.assert_frame_equal(again, df)

    # lantern.drafter.comparison's lookup supplies the drafter tables that --drafter-accuracy does not name
    lookup = {"embedded": tiny / "acc.parquet"}
    assert cmp.main(_args(tiny, out, "--cfg", "2.0"), accuracy_lookup=lookup.get) == 0
    looked = pd.read_parquet(out / "compare.parquet").set_index("model")
    assert looked.loc["embedded", "drafter_top1"] == 0.5 and looked.loc["embedded", "drafter_epochs"] == 1


def test_lantern_compare_finds_the_shipped_drafter_tables():
    from lantern.drafter.model import shipped_accuracy_path

    assert shipped_accuracy_path("embedded").is_file() and shipped_accuracy_path("text-twin").is_file()
    assert shipped_accuracy_path("no-such-model") is None
    acc = cmp.drafter_accuracy(shipped_accuracy_path("embedded"))
    assert acc["epoch"].iloc[0] == 0 and 0.5 < acc["top1"].iloc[-1] < 0.7  # 60.8 % shipped


def test_dataset_source_teacher_forces_heldout_text(tiny, tmp_path):
    settings = cmp.CompareSettings(num_images=3, batch_size=3, source="dataset", n_boot=10)
    table, summary = cmp.profile_one("text-twin", settings, None, weights=tiny / "twin", device="cpu", progress=False)
    assert summary["source"] == "dataset" and len(table) == 3 * 16
    from ambiguity.models.text_twin import load_heldout

    passages = load_heldout(tiny / "twin")
    idx = torch.randperm(6, generator=torch.Generator().manual_seed(0))[:3]
    assert table["token"].to_numpy().reshape(3, 16).tolist() == passages[idx].tolist()


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--models", "embedded,no-such-model"], "unknown model"),
        (["--weights", "embedded"], "MODEL=PATH"),
        (["--weights", "anole=/tmp"], "not in --models"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, needle, tmp_path):
    if argv[0] == "--models":  # one real subprocess: exit status and stderr as a user sees them
        r = subprocess.run(
            [sys.executable, "-m", "ambiguity.compare", *argv, "--out", str(tmp_path / "o")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr
        assert not (tmp_path / "o").exists()
    else:
        assert cmp.main(argv + ["--out", str(tmp_path / "o")]) == 2
        assert not (tmp_path / "o").exists()


def test_weights_retrained_in_place_are_not_read_back(tiny, tmp_path, capsys):
    """A finished model whose weights file was replaced (same path) is not reused: its profile
    run refuses the new weights, naming the digest, instead of reporting the old model's numbers."""
    import shutil

    shutil.copytree(tiny, tmp_path / "t")
    t, out = tmp_path / "t", tmp_path / "cmp"
    assert cmp.main(_args(t, out, "--cfg", "2.0")) == 0
    capsys.readouterr()
    gpt = GPT(GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=300, block_size=16, num_classes=10, multiple_of=32))
    save_module(gpt, gpt.config, t / "emb" / "fashion_gpt.safetensors")  # retrained (here: re-initialised)
    assert cmp.main(_args(t, out, "--cfg", "2.0")) == 2
    err = capsys.readouterr().err
    assert "other settings (key.model.weights_digest: '" in err and err.count("\n") == 1
