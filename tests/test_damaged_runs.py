"""Damaged and foreign parts of resumable runs (issue 15): recomputed with one note, or refused, never merged.

Every command that resumes keeps its finished units as checked parts (:class:`ambiguity.runs.RunDir`):
profile batches, generate images (tables and PNG), train_drafter token sets, feature shards and
the checkpoint, evaluate metric parts and the reference-statistics cache. For each, a finished
run is damaged in one of the ways a disk, a copy or a user damages runs:

* ``other-unit``: another unit's complete, valid part (manifest and files) copied over this one;
* ``other-file``: one data file of another unit copied over this unit's file (manifest kept);
* ``truncated``: a data file cut in half;
* ``file-deleted``: a data file removed, its manifest kept;
* ``manifest-broken``: the manifest is not JSON;
* ``other-settings``: the part (manifest and files) of a run with other settings copied in;

then the same command runs again into it. It must print exactly one ``note:`` line naming the
part and "recomputing it" on stderr, succeed, and write outputs equal to the undamaged run's
(tables compared without timing columns, names ending in ``_s`` or ``seconds``). A merge of a
sharded run refuses a damaged part with one ``error:`` line instead. Commands run in-process on
tiny random models (4 x 4 tokens), one thread.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from ambiguity.errors import UsageError
from ambiguity.models.checkpoints import save_module
from ambiguity.models.embedded import GPT_FILE, VQ_FILE, load_embedded
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.vq import VQConfig, VQModel
from ambiguity.runs import RunDir
from lantern.drafter.data import TokenSet, save_token_file
from lantern.drafter.model import Drafter

pytestmark = pytest.mark.slow  # about a minute on 2 cores: ~40 short runs of tiny models

DAMAGES = ("other-unit", "other-file", "truncated", "file-deleted", "manifest-broken", "other-settings")
LW = Path(__file__).resolve().parents[1] / "lantern" / "weights"


# --------------------------------------------------------------------------- tiny models
@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the same kernels in every run: outputs compare bit for bit
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def nb_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AMBIGUITY_NEIGHBOURHOOD_CACHE", str(tmp_path / "nb"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """Embedded-layout weights of a tiny model (64 codes, 4 x 4 tokens, 8 x 8 px) and its drafter."""
    d = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
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
    save_module(gpt, gc, d / GPT_FILE, dtype=torch.float32)
    save_module(VQModel(vc), vc, d / VQ_FILE, dtype=torch.float32)
    model = load_embedded(d)
    model.name = "embedded"
    Drafter.for_target(model, seed=1).save(d / "drafter.safetensors", dtype=torch.float32)
    return d


# --------------------------------------------------------------------------- damage and compare
def damage(run: Path, part: str, other: str, how: str, foreign: Path | None = None, data: str = "") -> None:
    """Damage the part ``part`` of ``run`` as ``how`` says (module docstring). ``other``: another
    unit's part in the same run; ``foreign``: a run of other settings; ``data``: the suffix of the
    data file to damage (default: the part's first data file)."""
    parts = run / "parts"
    files = sorted(p for p in parts.glob(f"{part}.*") if p.suffix != ".json")
    target = next((p for p in files if p.name.endswith(data)), None)
    if how == "other-unit":
        for f in parts.glob(f"{other}.*"):
            shutil.copy(f, parts / f.name.replace(other, part, 1))
    elif how == "other-file":
        shutil.copy(parts / target.name.replace(part, other, 1), target)
    elif how == "truncated":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    elif how == "file-deleted":
        target.unlink()
    elif how == "manifest-broken":
        (parts / f"{part}.json").write_text('{"part": ')
    elif how == "other-settings":
        for f in (foreign / "parts").glob(f"{part}.*"):
            shutil.copy(f, parts / f.name)
    else:  # pragma: no cover
        raise ValueError(how)


def one_note(err: str, part: str) -> str:
    """The single stderr line, a note that ``part`` is recomputed."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("note: ") and f"parts/{part} is not reused" in lines[0], lines[0]
    assert lines[0].endswith("recomputing it"), lines[0]
    return lines[0]


def untimed(path: Path) -> pd.DataFrame:
    df = pd.read_parquet(path)
    return df[[c for c in df.columns if not (c.endswith("_s") or c == "seconds")]]


def assert_same_tables(a: Path, b: Path, names) -> None:
    for name in names:
        pd.testing.assert_frame_equal(untimed(a / name), untimed(b / name), obj=name)


def fresh_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --------------------------------------------------------------------------- profile
def _profile(tiny: Path, out: Path, *extra) -> int:
    from ambiguity.profile import main

    return main(
        [
            "--weights",
            str(tiny),
            "--out",
            str(out),
            "--no-progress",
            "--num-images",
            "6",
            "--batch-size",
            "3",
            "--no-figures",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def profile_runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("profile")
    assert _profile(tiny, root / "clean") == 0
    assert _profile(tiny, root / "seed1", "--seed", "1") == 0
    return root


@pytest.mark.parametrize("how", DAMAGES)
def test_profile_batch_damaged_is_recomputed(how, profile_runs, tiny, tmp_path, capsys):
    run = fresh_copy(profile_runs / "clean", tmp_path / "run")
    damage(run, "batch_00000", "batch_00001", how, profile_runs / "seed1")
    capsys.readouterr()
    assert _profile(tiny, run) == 0
    one_note(capsys.readouterr().err, "batch_00000")
    assert_same_tables(run, profile_runs / "clean", ["tokens.parquet"])
    table = pd.read_parquet(run / "tokens.parquet")
    assert not table.duplicated(["image", "position"]).any() and sorted(table["image"].unique()) == list(range(6))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stats"] == json.loads((profile_runs / "clean" / "summary.json").read_text())["stats"]
    assert summary["batches"] == {"total": 2, "resumed": 1, "computed": 1}


def test_profile_with_figures_recomputes_another_batchs_part(profile_runs, tiny, tmp_path, capsys):
    """The reported case: a batch's part replaced by another batch's valid part (with figures)."""
    from ambiguity.profile import main

    run = fresh_copy(profile_runs / "clean", tmp_path / "run")
    damage(run, "batch_00001", "batch_00000", "other-unit")
    capsys.readouterr()
    assert (
        main(["--weights", str(tiny), "--out", str(run), "--no-progress", "--num-images", "6", "--batch-size", "3"])
        == 0
    )
    one_note(capsys.readouterr().err, "batch_00001")
    assert_same_tables(run, profile_runs / "clean", ["tokens.parquet"])
    assert (run / "top1_by_position.png").is_file()


# --------------------------------------------------------------------------- sharded profile: merge refuses
@pytest.mark.parametrize("how", ["other-unit", "truncated", "file-deleted", "manifest-broken", "other-settings"])
def test_merge_refuses_a_damaged_shard_part(how, profile_runs, tiny, tmp_path, capsys):
    from ambiguity.merge import main as merge

    run, foreign = tmp_path / "sharded", tmp_path / "sharded-seed1"
    for out, extra in ((run, ()), (foreign, ("--seed", "1"))):
        for i in (0, 1):
            assert _profile(tiny, out, "--num-shards", "2", "--shard-index", str(i), *extra) == 0
    damage(run, "batch_00000", "batch_00001", how, foreign)
    capsys.readouterr()
    assert merge([str(run), "--no-figures"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and "batch_00000" in err[0], err
    assert not (run / "tokens.parquet").exists()
    # rerunning the shard that owns the part repairs it; the merge then equals a single process
    assert _profile(tiny, run, "--num-shards", "2", "--shard-index", "0") == 0
    assert merge([str(run), "--no-figures"]) == 0
    assert_same_tables(run, profile_runs / "clean", ["tokens.parquet"])


# --------------------------------------------------------------------------- generate
def _generate(tiny: Path, out: Path, *extra) -> int:
    from lantern.generate import main

    return main(
        [
            "--weights",
            str(tiny),
            "--drafter",
            str(tiny / "drafter.safetensors"),
            "--out",
            str(out),
            "--no-progress",
            "--k",
            "8",
            "--gamma",
            "3",
            "--num-images",
            "3",
            "--delta",
            "0.3",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def generate_runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    assert _generate(tiny, root / "clean") == 0
    assert _generate(tiny, root / "seed1", "--seed", "1") == 0
    return root


GENERATE_CASES = [(how, "") for how in DAMAGES] + [
    ("other-file", "drafts.parquet"),
    ("truncated", "steps.parquet"),
    ("truncated", "image.parquet"),
]


@pytest.mark.parametrize("how, data", GENERATE_CASES, ids=[f"{h}-{d or 'first'}" for h, d in GENERATE_CASES])
def test_generate_image_part_damaged_is_recomputed(how, data, generate_runs, tiny, tmp_path, capsys):
    run = fresh_copy(generate_runs / "clean", tmp_path / "run")
    damage(run, "image_00001", "image_00002", how, generate_runs / "seed1", data)
    capsys.readouterr()
    assert _generate(tiny, run) == 0
    one_note(capsys.readouterr().err, "image_00001")
    _same_generate_outputs(run, generate_runs / "clean")


@pytest.mark.parametrize("how", ["png-replaced", "png-truncated", "png-deleted"])
def test_generate_png_damaged_is_recomputed(how, generate_runs, tiny, tmp_path, capsys):
    run = fresh_copy(generate_runs / "clean", tmp_path / "run")
    png = run / "images" / "00001.png"
    if how == "png-replaced":
        shutil.copy(run / "images" / "00002.png", png)
    elif how == "png-truncated":
        png.write_bytes(png.read_bytes()[:40])
    else:
        png.unlink()
    capsys.readouterr()
    assert _generate(tiny, run) == 0
    assert "00001.png" in one_note(capsys.readouterr().err, "image_00001")
    _same_generate_outputs(run, generate_runs / "clean")


FINAL_DAMAGES = {  # a finished run's final files as a copy or a user damages them
    "steps-from-other-run": lambda run, other: shutil.copy(other / "steps.parquet", run / "steps.parquet"),
    "summary-from-other-run": lambda run, other: shutil.copy(other / "summary.json", run / "summary.json"),
    "images-folder-replaced": lambda run, other: (
        shutil.rmtree(run / "images"),
        shutil.copytree(other / "images", run / "images"),
    ),
    "png-duplicated": lambda run, other: shutil.copy(run / "images" / "00000.png", run / "images" / "00002.png"),
}


@pytest.mark.parametrize("how", list(FINAL_DAMAGES))
def test_replay_and_evaluate_refuse_final_files_the_run_did_not_write(how, generate_runs, tiny, tmp_path, capsys):
    """The final tables, summary and PNGs are checked against the SHA-256 the run recorded when it
    wrote them: replay and evaluate refuse with one line naming the file and the command that
    rewrites it, and that command repairs the run."""
    from lantern.evaluate import main as evaluate_main
    from lantern.replay import main as replay_main

    run = fresh_copy(generate_runs / "clean", tmp_path / "run")
    FINAL_DAMAGES[how](run, generate_runs / "seed1")
    name = {
        "steps-from-other-run": "steps.parquet",
        "summary-from-other-run": "summary.json",
        "images-folder-replaced": "00000.png",
        "png-duplicated": "00002.png",
    }[how]
    capsys.readouterr()
    assert replay_main([str(run), "--out", str(tmp_path / "replay")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and name in err and "not the file this run wrote" in err, err
    assert f"--out {run}" in err
    assert (
        evaluate_main(
            [
                str(run),
                "--reference",
                str(generate_runs / "seed1"),
                "--extractors",
                "fmnist",
                "--bootstrap",
                "0",
                "--out",
                str(tmp_path / "eval"),
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and name in err, err
    assert _generate(tiny, run) == 0  # the fix the line names
    assert replay_main([str(run), "--out", str(tmp_path / "replay")]) == 0
    assert_same_tables(run, generate_runs / "clean", ["steps.parquet", "drafts.parquet", "images.parquet"])


def test_a_merge_without_figures_keeps_the_seal_of_the_images(generate_runs, tmp_path, capsys):
    """``ambiguity merge RUN --no-figures`` rewrites the tables only: the PNGs' SHA-256 stay sealed, so
    a PNG duplicated after the merge is still refused (it was scored before: FID 121.86, exit 0)."""
    from ambiguity.merge import main as merge_main
    from ambiguity.runs import RUN_FILE, SEAL_KEY
    from lantern.replay import main as replay_main

    run = fresh_copy(generate_runs / "clean", tmp_path / "run")
    before = json.loads((run / RUN_FILE).read_text())[SEAL_KEY]
    assert merge_main([str(run), "--no-figures"]) == 0
    after = json.loads((run / RUN_FILE).read_text())[SEAL_KEY]
    pngs = {f"images/{i:05d}.png" for i in range(3)}
    assert set(after) == set(before) and pngs <= set(after)  # every checksum kept (summary.json's wall time differs)
    assert {k: after[k] for k in pngs} == {k: before[k] for k in pngs}
    shutil.copy(run / "images" / "00000.png", run / "images" / "00002.png")
    capsys.readouterr()
    assert replay_main([str(run), "--out", str(tmp_path / "replay")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "00002.png" in err and "not the file this run wrote" in err, err


def _same_generate_outputs(run: Path, clean: Path) -> None:
    assert_same_tables(run, clean, ["steps.parquet", "drafts.parquet", "images.parquet"])
    for i in range(3):
        assert (run / "images" / f"{i:05d}.png").read_bytes() == (clean / "images" / f"{i:05d}.png").read_bytes()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["images_computed"] == 1 and summary["images_resumed"] == 2
    assert len(summary["notes"]) == 1


# --------------------------------------------------------------------------- train_drafter
def _train(tiny: Path, tokens: Path, run: Path, *extra) -> int:
    from lantern.drafter.train import main

    return main(
        [
            "--weights",
            str(tiny),
            "--device",
            "cpu",
            "--tokens",
            str(tokens),
            "--test-size",
            "8",
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--run-dir",
            str(run),
            "--out",
            str(run / "d.safetensors"),
            "--figure",
            str(run / "fig.png"),
            "--no-progress",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def drafter_runs(tiny, tmp_path_factory):
    from ambiguity.generation import sample_tokens
    from ambiguity.sampling import SamplingConfig

    root = tmp_path_factory.mktemp("drafter")
    model = load_embedded(tiny)
    labels = [i % 10 for i in range(40)]
    tokens = sample_tokens(model, model.make_prompt(labels), SamplingConfig(), torch.Generator().manual_seed(0))
    save_token_file(TokenSet(tokens, labels, "test"), root / "seqs.safetensors")
    assert _train(tiny, root / "seqs.safetensors", root / "clean") == 0
    assert _train(tiny, root / "seqs.safetensors", root / "seed1", "--seed", "1") == 0
    return root


DRAFTER_CASES = (
    [("train_features_00000", "test_features_00000", how) for how in DAMAGES]
    + [("tokens_test", "tokens_train", how) for how in ("other-unit", "truncated", "other-settings")]
    + [("checkpoint", None, how) for how in ("truncated", "file-deleted", "manifest-broken", "other-settings")]
)


@pytest.mark.parametrize("part, other, how", DRAFTER_CASES, ids=[f"{p}-{h}" for p, _, h in DRAFTER_CASES])
def test_drafter_run_part_damaged_is_recomputed(part, other, how, drafter_runs, tiny, tmp_path, capsys):
    clean = drafter_runs / "clean"
    run = fresh_copy(clean, tmp_path / "run")
    if part == "checkpoint" and how != "manifest-broken":  # its file lives in the run directory, not in parts/
        target = run / "checkpoint.pt"
        if how == "truncated":
            target.write_bytes(target.read_bytes()[:1000])
        elif how == "file-deleted":
            target.unlink()
        else:
            shutil.copy(drafter_runs / "seed1" / "checkpoint.pt", target)
    else:
        damage(run, part, other, how, drafter_runs / "seed1")
    capsys.readouterr()
    assert _train(tiny, drafter_runs / "seqs.safetensors", run) == 0
    one_note(capsys.readouterr().err, part)
    assert_same_tables(run, clean, ["accuracy.parquet", "d_accuracy.parquet"])
    from safetensors.torch import load_file

    a, b = load_file(run / "d.safetensors"), load_file(clean / "d.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_train_load_checkpoint_refuses_a_damaged_file(tmp_path):
    from ambiguity.train_loop import load_checkpoint, save_checkpoint

    path = tmp_path / "ckpt.pt"
    assert load_checkpoint(path) is None
    save_checkpoint(path, recipe={"a": 1}, step=3)
    assert load_checkpoint(path)["step"] == 3
    for blob in (path.read_bytes()[:50], b"not a checkpoint", b""):
        path.write_bytes(blob)
        with pytest.raises(UsageError, match=r"ckpt.pt is damaged .*--fresh"):
            load_checkpoint(path)
    save_checkpoint(path, something_else=1)  # a readable file of another kind
    with pytest.raises(UsageError, match="lacks recipe"):
        load_checkpoint(path)


# --------------------------------------------------------------------------- evaluate
def _evaluate(out: Path, cache: Path, *runs) -> int:
    from lantern.evaluate import main

    return main(
        [
            *runs,
            "--reference",
            "fashion-mnist:test@40",
            "--extractors",
            "fmnist",
            "--weights",
            f"fmnist={LW / 'fmnist_classifier.safetensors'}",
            "--bootstrap",
            "10",
            "--cache",
            str(cache),
            "--out",
            str(out),
            "--no-progress",
        ]
    )


SETS = ("fashion-mnist:train@20", "fashion-mnist:train@:20")


@pytest.fixture(scope="module")
def evaluate_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    assert _evaluate(root / "clean", root / "cache", *SETS) == 0
    from lantern.evaluate import main

    assert (
        main(
            [
                *SETS,
                "--reference",
                "fashion-mnist:test@40",
                "--extractors",
                "fmnist",
                "--weights",
                f"fmnist={LW / 'fmnist_classifier.safetensors'}",
                "--bootstrap",
                "12",
                "--cache",
                str(root / "cache"),
                "--out",
                str(root / "boot12"),
                "--no-progress",
            ]
        )
        == 0
    )
    return root


def _metric_parts(run: Path) -> list[str]:
    return sorted(p.stem for p in (run / "parts").glob("*.json"))


@pytest.mark.parametrize("how", DAMAGES)
def test_evaluate_part_damaged_is_recomputed(how, evaluate_runs, tmp_path, capsys):
    clean = evaluate_runs / "clean"
    run = fresh_copy(clean, tmp_path / "run")
    part, other = _metric_parts(run)
    damage(run, part, other, how, evaluate_runs / "boot12")
    capsys.readouterr()
    assert _evaluate(run, evaluate_runs / "cache", *SETS) == 0
    one_note(capsys.readouterr().err, part)
    assert_same_tables(run, clean, ["metrics.parquet"])


@pytest.mark.parametrize("how", ["truncated", "manifest-broken"])
def test_reference_statistics_cache_damaged_is_recomputed(how, evaluate_runs, tmp_path, capsys, monkeypatch):
    import lantern.quality.scoring as scoring

    monkeypatch.setattr(scoring, "_MEMORY", {})  # a new process: only the disk cache is there
    cache = fresh_copy(evaluate_runs / "cache", tmp_path / "cache")
    (stats_run,) = [d for d in cache.iterdir() if (d / "parts" / "stats.json").is_file()]
    damage(stats_run, "stats", None, how)
    capsys.readouterr()
    assert _evaluate(tmp_path / "out", cache, *SETS) == 0
    one_note(capsys.readouterr().err, "stats")
    assert_same_tables(tmp_path / "out", evaluate_runs / "clean", ["metrics.parquet"])


# --------------------------------------------------------------------------- the mechanism itself
def test_a_part_renamed_from_another_unit_with_the_same_holds_is_not_reused(tmp_path):
    """Two units may hold equal ``holds`` (e.g. train and test feature shards without guidance
    rows); a manifest copied under another part's name is still refused."""
    notes = []
    run = RunDir(tmp_path / "r", {"a": 1}, command="test", report=notes.append).open()
    run.write_part("train_00000", {"rows": [0, 8]}, tables={"t": pd.DataFrame({"x": range(8)})})
    run.write_part("test_00000", {"rows": [0, 8]}, tables={"t": pd.DataFrame({"x": range(8, 16)})})
    for suffix in (".json", ".t.parquet"):
        shutil.copy(run.parts_dir / f"test_00000{suffix}", run.parts_dir / f"train_00000{suffix}")
    assert run.read_part("train_00000", {"rows": [0, 8]}) is None
    assert len(notes) == 1 and "that of the part 'test_00000'" in notes[0]
    assert run.read_part("test_00000", {"rows": [0, 8]}) is not None


@pytest.mark.parametrize("manifest", ["[1, 2]", '{"part": "p", "files": [1]}', '{"part": "p", "files": {"x": 3}}'])
def test_manifests_of_the_wrong_shape_are_unreadable_not_tracebacks(manifest, tmp_path):
    notes = []
    run = RunDir(tmp_path / "r", {"a": 1}, command="test", report=notes.append).open()
    run.write_part("p", {"i": 0}, tables={"t": pd.DataFrame({"x": [1]})})
    m = json.loads(manifest) if manifest.startswith("{") else None
    if m is not None:
        m["digest"], m["holds"] = run.digest, {"i": 0}
    run.manifest_path("p").write_text(json.dumps(m) if m is not None else manifest)
    assert run.read_part("p", {"i": 0}) is None and len(notes) == 1 and "recomputing" in notes[0]
    with pytest.raises(UsageError, match="lacks the intact part p"):
        run.require_parts(["p"], [{"i": 0}])
