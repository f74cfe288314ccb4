"""``python -m lantern.generate`` and ``python -m lantern.replay`` on a tiny embedded model
saved into a temporary directory (outputs, resume, greedy equality, one-line errors)."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from ambiguity.models.checkpoints import save_module
from ambiguity.models.embedded import load_embedded
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.vq import VQConfig, VQModel
from ambiguity.seeding import image_seed
from lantern.drafter.model import Drafter
from lantern.generate import build_parser, main
from lantern.methods.drafting import RELAXED
from lantern.replay import main as replay_main
from lantern.rules.acceptance import RULES


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models; two threads spin on busy shared cores
    yield
    torch.set_num_threads(before)


def _save_tiny(d, seed=0):
    torch.manual_seed(seed)
    gc = GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=64, block_size=16, num_classes=10, multiple_of=32)
    gpt = GPT(gc)
    torch.nn.init.normal_(gpt.output.weight, 0.0, 0.3)
    vc = VQConfig(
        codebook_size=64,
        codebook_embed_dim=4,
        encoder_ch_mult=[1, 2],
        decoder_ch_mult=[1, 2],
        z_channels=32,
        ch=32,
        num_res_blocks=1,
        in_channels=1,
    )
    d.mkdir(parents=True, exist_ok=True)
    save_module(gpt, gc, d / "fashion_gpt.safetensors", dtype=torch.float32)
    save_module(VQModel(vc), vc, d / "fashion_vq.safetensors", dtype=torch.float32)
    model = load_embedded(d)
    model.name = "embedded"
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    model = _save_tiny(root / "weights")
    Drafter.for_target(model, seed=1).save(root / "drafter.safetensors", dtype=torch.float32)
    other = _save_tiny(root / "other", seed=9)
    Drafter.for_target(other, seed=1).save(root / "other_drafter.safetensors", dtype=torch.float32)
    return root


@pytest.fixture(autouse=True)
def nb_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AMBIGUITY_NEIGHBOURHOOD_CACHE", str(tmp_path / "nb"))


def _args(tiny, out, *extra):
    """The command line of a run of the tiny model; --k 8 and --gamma 3 (a chain) for the methods that read them."""
    method = extra[extra.index("--method") + 1] if "--method" in extra else "lantern"
    chain = "--tree" not in extra or extra[extra.index("--tree") + 1] == "chain"
    drafting = (["--k", "8"] if method in RELAXED else []) + (["--gamma", "3"] if method in RULES and chain else [])
    drafter = ["--drafter", str(tiny / "drafter.safetensors")] if method in RULES else []
    return [
        "--weights",
        str(tiny / "weights"),
        *drafter,
        "--out",
        str(out),
        "--no-progress",
        *drafting,
        *extra,
    ]


def test_outputs_summary_and_resume(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_args(tiny, out, "--method", "lantern", "--delta", "0.3", "--num-images", "2")) == 0
    printed = capsys.readouterr().out
    assert "τ (+bonus)" in printed and "2 images computed, 0 resumed" in printed
    for f in (
        "steps.parquet",
        "drafts.parquet",
        "images.parquet",
        "summary.json",
        "grid.png",
        "grid.pdf",
        "images/00000.png",
        "images/00001.png",
    ):
        assert (out / f).is_file(), f
    steps, drafts, images = (pd.read_parquet(out / f"{n}.parquet") for n in ("steps", "drafts", "images"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["images"] == 2 and summary["tokens"] == 32 == images["tokens"].sum()
    assert summary["steps"] == len(steps) and summary["target_forwards"] == 2 + len(steps)
    assert summary["tau"] == pytest.approx(30 / len(steps))
    assert summary["acceptance_rate"] == pytest.approx(drafts["committed"].sum() / drafts["reached"].sum())
    assert [len(c) for c in images["codes"]] == [16, 16]
    assert images["seed"].tolist() == [image_seed(0, 0), image_seed(0, 1)]
    first = (out / "parts" / "image_00000.image.parquet").stat().st_mtime_ns
    assert main(_args(tiny, out, "--method", "lantern", "--delta", "0.3", "--num-images", "3")) == 0
    assert "1 images computed, 2 resumed" in capsys.readouterr().out
    assert (out / "parts" / "image_00000.image.parquet").stat().st_mtime_ns == first
    again = pd.read_parquet(out / "images.parquet")
    assert again["codes"].iloc[1].tolist() == images["codes"].iloc[1].tolist()
    # another setting into the same directory is refused, --overwrite starts over
    assert main(_args(tiny, out, "--method", "lantern", "--delta", "0.1")) == 2
    assert "other settings (delta: 0.3 there, 0.1 now)" in capsys.readouterr().err
    assert main(_args(tiny, out, "--method", "lantern", "--delta", "0.1", "--num-images", "1", "--overwrite")) == 0
    assert len(pd.read_parquet(out / "images.parquet")) == 1


def test_greedy_lantern_delta_zero_equals_ar_and_replay(tiny, tmp_path, capsys):
    common = ["--temperature", "0", "--num-images", "3", "--cfg", "2"]
    assert main(_args(tiny, tmp_path / "ar", "--method", "ar", *common)) == 0
    assert main(_args(tiny, tmp_path / "la0", "--method", "lantern", "--delta", "0", *common)) == 0
    assert main(_args(tiny, tmp_path / "la", "--method", "lantern", "--delta", "0.4", *common)) == 0
    ar, la0 = (pd.read_parquet(tmp_path / r / "images.parquet") for r in ("ar", "la0"))
    assert [list(c) for c in ar["codes"]] == [list(c) for c in la0["codes"]]
    capsys.readouterr()
    assert (
        replay_main(
            [
                str(tmp_path / "la0"),
                str(tmp_path / "la"),
                "--reference",
                str(tmp_path / "ar"),
                "--out",
                str(tmp_path / "replay"),
                "--bins",
                "4",
            ]
        )
        == 0
    )
    q = pd.read_parquet(tmp_path / "replay" / "image_quality.parquet")
    exact = q[q["method"] == "lantern k=8 δ=0"]
    assert (exact["token_match"] == 1).all() and (exact["mse"] == 0).all() and np.isinf(exact["psnr"]).all()
    bins = pd.read_parquet(tmp_path / "replay" / "acceptance_by_ambiguity.parquet")
    drafts = pd.read_parquet(tmp_path / "la" / "drafts.parquet")
    one = bins[(bins["by"] == "p_top1") & (bins["method"] == "lantern k=8 δ=0.4")]
    assert one["drafts"].sum() == drafts["reached"].sum() and one["committed"].sum() == drafts["committed"].sum()
    assert (tmp_path / "replay" / "replay.png").is_file()


def test_batched_trees_equal_batch_one_on_the_command_line(tiny, tmp_path):
    """--batch-size with --tree: a static and a dynamic tree in float64 give batch 1's codes (3
    images through 2 slots, CFG, sampling)."""
    common = ["--num-images", "3", "--cfg", "2", "--dtype", "float64", "--method", "lantern", "--delta", "0.3"]
    for tree in (["--tree", "mc_sim_7b_63"], ["--tree", "dynamic", "--total-tokens", "8", "--depth", "2"]):
        one, two = tmp_path / f"{tree[1]}-1", tmp_path / f"{tree[1]}-2"
        assert main(_args(tiny, one, *common, *tree)) == 0
        assert main(_args(tiny, two, *common, *tree, "--batch-size", "2")) == 0
        a, b = (pd.read_parquet(r / "images.parquet") for r in (one, two))
        assert [list(c) for c in a["codes"]] == [list(c) for c in b["codes"]], tree
        steps = pd.read_parquet(two / "steps.parquet")
        assert steps["active"].max() == 2 and steps["drafted"].max() > 1


def test_replay_notes_what_makes_a_reference_less_comparable(tiny, tmp_path, capsys):
    assert main(_args(tiny, tmp_path / "ar", "--method", "ar", "--num-images", "2")) == 0
    assert main(_args(tiny, tmp_path / "sd", "--method", "sd", "--num-images", "3", "--temperature", "0")) == 0
    capsys.readouterr()
    assert replay_main([str(tmp_path / "sd"), "--reference", str(tmp_path / "ar"), "--out", str(tmp_path / "r")]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert len(notes) == 2
    assert "temperature is 0.0 here but 1.0 in the reference" in notes[0]
    assert "covers 2 of its 3 images" in notes[1]
    assert len(pd.read_parquet(tmp_path / "r" / "image_quality.parquet")) == 2


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "lantern", "--delta", "-0.1"], "error: --delta must be >= 0"),
        (["--method", "lantern++", "--lam", "0.5"], "error: --lam must be >= 1"),
        (["--method", "lantern", "--k", "64"], "must be smaller than the vocabulary size 64"),
        (["--method", "sd", "--gamma", "0"], "argument --gamma: must be a positive integer or auto, got '0'"),
        (["--method", "sd", "--gamma", "fast"], "argument --gamma: must be a positive integer or auto, got 'fast'"),
        (
            ["--method", "sd", "--gamma-max", "6"],
            "error: --gamma-max does not apply to --gamma 3, only to --gamma auto",
        ),
        (["--method", "medusa"], "invalid choice: 'medusa'"),
        (["--method", "sd", "--drafter", "OTHER"], "drafter was trained for embedded with other weights"),
        # a flag the method ignores, even at its default value (--gamma 4)
        (["--method", "sjd", "--tree", "dynamic"], "error: --tree does not apply to --method sjd, only to sd, lantern"),
        (["--method", "ar", "--gamma", "4"], "error: --gamma does not apply to --method ar, only to sd, lantern"),
        (["--method", "ar", "--window", "4"], "error: --window does not apply to --method ar, only to sjd, gsd, scd"),
        (["--method", "sjd", "--gsd-group", "3"], "error: --gsd-group does not apply to --method sjd, only to gsd;"),
        (["--method", "lantern", "--scd-coupling", "gumbel"], "error: --scd-coupling does not apply to --method lan"),
        # flags the rule or the draft shape does not read (lantern.rules.acceptance.BOUNDS, the --tree kind)
        (["--method", "sd", "--delta", "0.3"], "error: --delta does not apply to --method sd, only to lantern, lant"),
        (["--method", "sd", "--k", "5"], "error: --k does not apply to --method sd, only to lantern, lantern-jsd,"),
        (["--method", "sd", "--lam", "2"], "error: --lam does not apply to --method sd, only to lantern++; drop it"),
        (["--method", "sd", "--metric", "cosine"], "error: --metric does not apply to --method sd, only to lantern,"),
        (["--method", "sd", "--matrix", "codebook"], "error: --matrix does not apply to --method sd, only to lantern,"),
        (
            ["--method", "lantern++", "--delta", "0.3"],
            "error: --delta does not apply to --method lantern++, only to lantern, lantern-jsd "
            "(lantern++ is bounded by --lam); drop it",
        ),
        (["--method", "lantern-jsd", "--lam", "2"], "error: --lam does not apply to --method lantern-jsd, only to lan"),
        (
            ["--method", "lantern", "--k", "0", "--metric", "cosine"],
            "error: --metric does not apply with --k 0 (no latent neighbourhood: lantern accepts as sd), "
            "only with --k >= 1; drop it\n",
        ),
        (
            ["--method", "lantern", "--k", "0", "--delta", "0.2"],
            "error: --delta does not apply with --k 0 (no latent neighbourhood: lantern accepts as sd), "
            "only with --k >= 1; drop it\n",
        ),
        (
            ["--method", "lantern++", "--k", "0", "--lam", "2"],
            "error: --lam does not apply with --k 0 (no latent neighbourhood: lantern++ accepts as sd), "
            "only with --k >= 1; drop it\n",
        ),
        (
            ["--method", "lantern++", "--k", "0", "--matrix", "codebook"],
            "error: --matrix does not apply with --k 0 (no latent neighbourhood: lantern++ accepts as sd), "
            "only with --k >= 1; drop it\n",
        ),
        (
            ["--method", "sd", "--tree", "dynamic", "--gamma", "3"],
            "error: --gamma does not apply to --tree dynamic (a tree sets its own depth), only to --tree chain;",
        ),
        (["--method", "sd", "--tree", "mc_sim_7b_63", "--gamma", "4"], "error: --gamma does not apply to --tree mc_"),
        (
            ["--method", "sd", "--tree", "mc_sim_7b_63", "--gamma", "auto"],
            "error: --gamma does not apply to --tree mc_sim_7b_63 (a fixed shape), only to a chain or --tree dynamic;",
        ),
        (
            ["--method", "sd", "--tree", "chain", "--total-tokens", "20"],
            "error: --total-tokens does not apply to --tree chain, only to --tree dynamic; drop it",
        ),
        (["--method", "sd", "--depth", "3"], "error: --depth does not apply to --tree chain, only to --tree dynamic;"),
        (
            ["--method", "sd", "--tree", "mc_sim_7b_63", "--tree-top-k", "4"],
            "error: --tree-top-k does not apply to --tree mc_sim_7b_63 (static), only to --tree dynamic; drop it",
        ),
    ],
)
def test_bad_parameters_exit_2_with_one_line(tiny, tmp_path, capsys, extra, message):
    args = _args(tiny, tmp_path / "bad", "--num-images", "1", *extra)
    args = [a.replace("OTHER", str(tiny / "other_drafter.safetensors")) for a in args]  # argparse: last wins
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "bad" / "summary.json").exists()


def test_default_cfg_and_the_same_explicit_cfg_are_one_run(tiny, tmp_path, capsys):
    out = tmp_path / "g"
    assert main(_args(tiny, out, "--method", "ar", "--num-images", "1")) == 0  # c2i default: cfg 4
    assert main(_args(tiny, out, "--method", "ar", "--num-images", "1", "--cfg", "4")) == 0
    assert "0 images computed, 1 resumed" in capsys.readouterr().out


def _tables(out):
    """The run's three tables without their timing columns (``*_s``), which differ by nature."""
    frames = (pd.read_parquet(out / f"{n}.parquet") for n in ("steps", "drafts", "images"))
    return [df[[c for c in df.columns if not c.endswith("_s")]] for df in frames]


def test_independent_shards_resume_a_damaged_image_and_merge_to_the_one_process_run(tiny, tmp_path, capsys):
    """Two shards of three images (shard 0: images 0 and 2); a torn part of image 2 is recomputed
    alone on shard 0's rerun, and the merge equals the one-process run table for table, PNG for PNG."""
    from ambiguity.merge import main as merge_main

    args = ("--method", "lantern", "--delta", "0.3", "--num-images", "3")
    assert main(_args(tiny, tmp_path / "one", *args)) == 0
    out = tmp_path / "sharded"
    shard = lambda i: main(_args(tiny, out, *args, "--shard-index", str(i), "--num-shards", "2"))
    assert shard(1) == 0 and shard(0) == 0
    assert "shard 1/2 done" in capsys.readouterr().out and not (out / "images.parquet").exists()
    (out / "parts" / "image_00002.steps.parquet").write_bytes(b"PAR1 torn")
    first = (out / "parts" / "image_00000.steps.parquet").stat().st_mtime_ns
    assert merge_main([str(out)]) == 2 and "image_00002" in capsys.readouterr().err
    assert shard(0) == 0
    err = capsys.readouterr().err
    assert "image_00002 is not reused" in err and "image_00000" not in err
    assert (out / "parts" / "image_00000.steps.parquet").stat().st_mtime_ns == first
    assert merge_main([str(out)]) == 0
    for a, b in zip(_tables(tmp_path / "one"), _tables(out)):
        pd.testing.assert_frame_equal(a, b)
    for i in range(3):
        assert (out / f"images/{i:05d}.png").read_bytes() == (tmp_path / "one" / f"images/{i:05d}.png").read_bytes()


def test_run_generate_takes_run_options_or_the_old_keywords(tiny, tmp_path):
    """``run_generate(..., RunOptions(out=...))`` and the old ``out=, progress=, overwrite=``
    keywords write the same run; without a run directory it is a TypeError."""
    from ambiguity.runs import RunOptions
    from ambiguity.sampling import SamplingConfig
    from lantern.engine.decode import DecodeConfig
    from lantern.generate import run_generate

    model = load_embedded(tiny / "weights")
    config, sampling = DecodeConfig.of("ar"), SamplingConfig(guidance=2.0)
    new = run_generate(model, [1, 4], config, sampling, RunOptions(out=tmp_path / "new", progress=False), seed=5)
    old = run_generate(
        model,
        [1, 4],
        config,
        sampling,
        seed=5,
        options=RunOptions(out=tmp_path / "old", progress=False, overwrite=True),
    )
    assert new[2]["codes"].map(list).tolist() == old[2]["codes"].map(list).tolist()
    assert new[3]["images_computed"] == old[3]["images_computed"] == 2
    with pytest.raises(TypeError, match="needs a run directory"):
        run_generate(model, [1], config, sampling, options=RunOptions(progress=False))


def _groups_of(parser) -> dict:
    """dest -> the methods of the option group that declared it."""
    return {a.dest: a.group.methods for a in parser._actions if getattr(a, "group", None) is not None}


def test_each_option_is_declared_by_the_methods_that_read_it():
    """The groups follow lantern.rules.acceptance.BOUNDS: sd reads no neighbourhood option, δ bounds
    lantern and lantern-jsd, λ bounds lantern++; --convention and the tree options go with every
    rule; the Jacobi window with sjd/gsd/scd/sjd-pac, each knob with its own method."""
    groups = _groups_of(build_parser())
    assert RELAXED == ("lantern", "lantern-jsd", "lantern++")
    assert groups["delta"] == ("lantern", "lantern-jsd") and groups["lam"] == ("lantern++",)
    assert groups["k"] == groups["metric"] == groups["matrix"] == RELAXED
    assert groups["convention"] == groups["gamma"] == RULES
    assert groups["depth"] == groups["tree"] == tuple(m for m in RULES if m not in ("cool-sd", "fly"))
    assert groups["cool_delta"] == groups["cool_nu"] == ("cool-sd",) and groups["fly_window"] == ("fly",)
    assert groups["window"] == ("sjd", "gsd", "scd", "entropy-sd", "sjd-pac")
    assert groups["jacobi_init"] == ("sjd", "gsd", "scd", "entropy-sd") and groups["entropy_floor"] == ("entropy-sd",)
    assert groups["entropy_min_window"] == groups["entropy_window_scale"] == ("entropy-sd",)
    assert groups["gsd_group"] == ("gsd",) and groups["scd_coupling"] == ("scd",)
    assert groups["pac_width"] == groups["pac_depth"] == groups["pac_continuation"] == ("sjd-pac",)
    assert groups["drafter"] == RULES and "method" not in groups  # the drafted methods read a drafter


@pytest.mark.parametrize(
    "argv",
    [
        ["--method", "sd", "--gamma", "4", "--convention", "exact", "--drafter", "x.safetensors"],
        [
            "--method",
            "lantern",
            "--k",
            "3",
            "--delta",
            "0.1",
            "--metric",
            "l2",
            "--matrix",
            "codebook",
            "--tree",
            "mc_sim_7b_63",
        ],
        [
            "--method",
            "lantern++",
            "--lam",
            "2",
            "--total-tokens",
            "9",
            "--depth",
            "2",
            "--tree-top-k",
            "3",
            "--tree",
            "dynamic",
        ],
        ["--method", "lantern-jsd", "--delta", "0.1", "--gamma", "2"],
        ["--method", "gsd", "--window", "4", "--jacobi-init", "random", "--gsd-group", "3", "--gsd-prob-gap", "0.1"],
        ["--method", "scd", "--scd-coupling", "maximal"],
        ["--method", "cool-sd", "--cool-delta", "2", "--cool-nu", "0.7", "--gamma", "4"],
        ["--method", "fly", "--fly-entropy", "0.3", "--fly-window", "2", "--gamma", "3"],
        ["--method", "entropy-sd", "--window", "24", "--entropy-min-window", "4", "--entropy-window-scale", "6"],
        ["--method", "sjd", "--window", "auto", "--window-max", "8"],
        ["--method", "lantern", "--tree", "dynamic", "--gamma", "auto", "--total-tokens", "9"],
    ],
)
def test_options_a_method_reads_are_accepted(argv):
    """The options each method and tree reads pass the check (typed at their default values too)."""
    from lantern.engine.options import check_method_options

    parser = build_parser()
    check_method_options(parser, parser.parse_args(argv))


def test_compile_on_an_eager_model_is_refused_before_its_weights_load(tmp_path, capsys, monkeypatch):
    """``--model anole --compile`` (weights absent) ends with the compile line, not the weights
    error: the registry knows the transformers adapters run eager; nothing is loaded or written."""
    import lantern.generate as gen
    from ambiguity.models.registry import available_models, get_spec

    monkeypatch.setattr(gen, "load_model", lambda *a, **k: pytest.fail("weights loaded before the refusal"))
    out = tmp_path / "run"
    argv = ["--model", "anole", "--method", "ar", "--compile", "--num-images", "1", "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: --compile works for the LlamaGen-architecture models (embedded, embedded-16, llamagen-*, "
        "text-twin); anole runs eager only, drop --compile\n"
    )
    assert not out.exists()
    compiling = sorted(n for n in available_models() if get_spec(n).compiles)
    assert compiling == sorted(
        ["embedded", "embedded-16", "text-twin"] + [n for n in available_models() if n.startswith("llamagen-")]
    )
    assert all(get_spec(n).compiles is False for n in available_models() if n not in compiling)
    assert get_spec("hf:some/repo").compiles is False


def test_summary_records_batch_size_and_compile(tiny, tmp_path, capsys):
    """summary.json holds ``batch_size`` and ``compile``; a compiled run (run_generate's
    ``compiled``, as --compile passes it) notes that its first images' seconds include compilation."""
    from ambiguity.runs import RunOptions
    from ambiguity.sampling import SamplingConfig
    from lantern.engine.decode import DecodeConfig
    from lantern.generate import COMPILE_NOTE, run_generate

    out = tmp_path / "plain"
    assert main(_args(tiny, out, "--method", "sd", "--num-images", "2", "--batch-size", "2")) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["batch_size"] == 2 and summary["compile"] is False
    assert COMPILE_NOTE not in summary["notes"] and "note: compiled" not in printed and "batch size 2" in printed

    model = load_embedded(tiny / "weights")
    config, sampling = DecodeConfig.of("ar"), SamplingConfig(guidance=2.0)
    opts = RunOptions(out=tmp_path / "compiled", progress=False)
    summary = run_generate(model, [1], config, sampling, opts, compiled=True)[3]
    assert summary["compile"] is True and summary["batch_size"] == 1 and COMPILE_NOTE in summary["notes"]
    assert json.loads((tmp_path / "compiled" / "summary.json").read_text())["compile"] is True
    resumed = run_generate(model, [1], config, sampling, opts, compiled=True)[3]  # nothing computed: no note
    assert resumed["images_resumed"] == 1 and COMPILE_NOTE not in resumed["notes"]


def test_ar_summary_shows_no_acceptance(tiny, tmp_path, capsys):
    """AR drafts nothing: the printed summary has α n/a and no accepted-drafts histogram, the rest stays."""
    assert main(_args(tiny, tmp_path / "ar", "--method", "ar", "--num-images", "1")) == 0
    printed = capsys.readouterr().out
    header, row = printed.splitlines()[:2]
    assert "α" in header and "n/a" in row.split() and "NaN" not in printed and "nan" not in printed
    assert "accepted drafts per step" not in printed and "1 images computed, 0 resumed" in printed
    assert main(_args(tiny, tmp_path / "sd", "--method", "sd", "--num-images", "1")) == 0
    assert "accepted drafts per step (0..3): [" in capsys.readouterr().out


def test_written_outputs_list_only_what_the_model_writes():
    """The final ``wrote`` line: no images/ or grid.png for a model without pixels (text-twin)."""
    from lantern.generate import written_outputs

    assert written_outputs(False) == ["steps.parquet", "drafts.parquet", "images.parquet", "summary.json"]
    assert written_outputs(True)[:2] == ["images/", "grid.png"]


def test_a_run_is_refused_once_its_weights_or_its_drafter_file_changed(tiny, tmp_path, capsys):
    """Retraining the target or the drafter in place (same paths) must not resume a run into a
    mix of two models' images: the record holds both weights digests."""
    import shutil

    w, d, out = tmp_path / "w", tmp_path / "d.safetensors", tmp_path / "run"
    shutil.copytree(tiny / "weights", w)
    shutil.copy(tiny / "drafter.safetensors", d)

    def args(*extra):
        return ["--weights", str(w), "--drafter", str(d), "--out", str(out), "--no-progress", "--k", "8"] + [
            "--gamma",
            "3",
            "--method",
            "lantern",
            "--num-images",
            "1",
            *extra,
        ]

    assert main(args()) == 0
    record = json.loads((out / "run.json").read_text())["settings"]
    assert len(record["weights_digest"]) == 16 and len(record["drafter_digest"]) == 16
    assert main(args()) == 0 and "0 images computed, 1 resumed" in capsys.readouterr().out
    model = load_embedded(w)
    model.name = "embedded"
    Drafter.for_target(model, seed=2).save(d, dtype=torch.float32)  # another drafter, same file
    assert main(args()) == 2
    err = capsys.readouterr().err
    assert f"other settings (drafter_digest: '{record['drafter_digest']}' there, '" in err
    shutil.copytree(tiny / "other", w, dirs_exist_ok=True)  # another target, same folder
    shutil.copy(tiny / "other_drafter.safetensors", d)  # with its own drafter
    assert main(args()) == 2
    assert f"other settings (weights_digest: '{record['weights_digest']}' there, '" in (capsys.readouterr().err)


def test_summary_records_the_batch_size_used_and_what_resumed_images_were_computed_with(tiny, tmp_path, capsys):
    """A batch size above the image count records the images decoded together; a resume with other
    speed settings decodes nothing and keeps the images' own settings, with a note."""
    out = tmp_path / "run"
    assert main(_args(tiny, out, "--method", "sd", "--num-images", "4", "--batch-size", "100000000000")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["batch_size"] == 4 and summary["compile"] is False
    assert summary["computed_with"] == [{"batch_size": 4, "compile": False, "images": 4}]
    timings = summary["seconds_per_image"]
    assert main(_args(tiny, out, "--method", "sd", "--num-images", "4", "--batch-size", "2")) == 0
    assert "0 images computed, 4 resumed" in capsys.readouterr().out
    again = json.loads((out / "summary.json").read_text())
    assert again["batch_size"] == 4 and again["seconds_per_image"] == timings
    assert again["notes"][-1] == (
        "this call asked for batch size 2, compile False and decoded 0 image(s); the images were computed with: "
        "4 image(s) with batch size 4, compile False (unknown: computed before this was recorded); the timings "
        "are those of each image's own settings"
    )


def test_run_records_its_captions_digest_and_the_grid_is_titled(tiny, tmp_path):
    import hashlib

    from ambiguity.runs import RunOptions
    from ambiguity.sampling import SamplingConfig
    from lantern.engine.decode import DecodeConfig
    from lantern.generate import grid_title, run_generate

    caps = tmp_path / "caps.txt"
    caps.write_text("a red dress\n1984\n")
    model = load_embedded(tiny / "weights")
    config, sampling = DecodeConfig.of("ar"), SamplingConfig(guidance=2.0, temperature=0.0)
    settings = {"model": "embedded", "captions": str(caps), "seed": 0}
    summary = run_generate(
        model, [1, 2], config, sampling, RunOptions(out=tmp_path / "g", progress=False), settings=settings
    )[3]
    assert summary["settings"]["captions_sha256"] == hashlib.sha256(caps.read_bytes()).hexdigest()
    assert grid_title(summary, 2) == "ar — cfg 2, temperature 0 — 2 images"
    lantern = {
        "method": "lantern",
        "rule": {"method": "lantern", "k": 8, "delta": 0.3, "gamma": 3, "tree": "chain"},
        "sampling": {"guidance": 4.0, "temperature": 1.0, "top_k": 100, "top_p": 0.9},
    }
    assert (
        grid_title(lantern, 16)
        == "lantern k=8 δ=0.3 chain γ=3 — cfg 4, temperature 1, top-k 100, top-p 0.9 — 16 images"
    )


def test_the_parser_records_the_flags_typed_even_at_their_default():
    """``lantern.generate``'s parser records each value option the user typed (``args.typed``), at its
    default value or not, so ``check_method_options`` refuses another method's option without parsing twice."""

    args = build_parser().parse_args(["--method", "ar", "--gamma", "4", "--num-images", "2"])
    assert args.gamma == 4 and args.typed == {"gamma"}  # the options a method declares record themselves
    assert not {"k", "delta", "tree", "window"} & args.typed
    assert not hasattr(build_parser().parse_args([]), "typed")  # nothing typed: nothing recorded
