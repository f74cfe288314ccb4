"""scripts/session_scores.py: per-image quality proxies of a lantern.paper session, paired with AR."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from fake_data import load_script
from safetensors.torch import save_file

from ambiguity.models.registry import load_model
from lantern.run_reader import target_scores

scores = load_script(Path(__file__).resolve().parents[1] / "scripts" / "session_scores.py")


def test_summary_pairs_each_method_with_ar_on_shared_images():
    per_image = pd.DataFrame(
        {
            "method": ["ar", "ar", "m", "m", "m"],
            "image": [0, 1, 0, 1, 2],  # image 2 has no AR twin: left out
            "target_nll": [1.0, 3.0, 2.0, 3.0, 100.0],
            "class_consistency": [1.0, 0.0, 1.0, 1.0, 0.0],
            "classifier_accuracy": [1.0, 1.0, 0.0, 1.0, 0.0],
        }
    )
    s = scores.summarise(per_image).set_index("method")
    assert s.loc["m", "images"] == 2 and s.loc["m", "target_nll"] == 2.5 and s.loc["m", "target_nll_diff"] == 0.5
    assert s.loc["m", "class_consistency_diff"] == 0.5 and s.loc["m", "classifier_accuracy_diff"] == -0.5
    assert (s.loc["ar", "target_nll_diff"], s.loc["ar", "target_nll_diff_lo"], s.loc["ar", "target_nll_diff_hi"]) == (
        0,
        0,
        0,
    )
    # image-bootstrap of the differences (0.0, 1.0) from class_consistency: resampled means lie in [0, 1]
    assert 0.0 <= s.loc["m", "class_consistency_diff_lo"] <= 0.5 <= s.loc["m", "class_consistency_diff_hi"] <= 1.0


def _session(path: Path, methods: dict, conditions) -> Path:
    parts = path / "parts"
    parts.mkdir(parents=True)
    for r, c in enumerate(conditions):
        name = f"round_{r:05d}"
        rows = pd.DataFrame({"method": list(methods), "image": r, "condition": c})
        rows.to_parquet(parts / f"{name}.images.parquet")
        save_file({m: t[r : r + 1].contiguous() for m, t in methods.items()}, parts / f"{name}.tokens.safetensors")
        (parts / f"{name}.json").write_text(json.dumps({"part": name}))
    return path


def test_scores_of_a_session_equal_the_target_scores(tmp_path, capsys):
    """A session of the shipped embedded model: 'copy' is AR's tokens (every difference exactly 0),
    'flip' AR's tokens reversed; the NLL and consistency are target_scores' own."""
    model = load_model("embedded")
    g = torch.Generator().manual_seed(0)
    ar = torch.randint(0, 1024, (3, 64), generator=g)
    session = _session(tmp_path / "s", {"ar": ar, "copy": ar.clone(), "flip": ar.flip(1)}, [3, 7, 0])
    assert scores.main([str(session), "--model", "embedded"]) == 0
    s = pd.read_csv(session / "scores.csv").set_index("method")
    assert list(s.index) == ["ar", "copy", "flip"] and (s["images"] == 3).all()
    for m in scores.METRICS:
        assert s.loc["copy", m] == s.loc["ar", m] and s.loc["copy", f"{m}_diff"] == 0.0
    frame = pd.DataFrame({"image": [0, 1, 2], "condition": [3, 7, 0], "codes": list(ar.flip(1).numpy())})
    direct = target_scores(model, frame)
    assert s.loc["flip", "target_nll"] == pytest.approx(direct["nll"].mean(), abs=1e-6)
    assert s.loc["flip", "class_consistency"] == pytest.approx(direct["consistent"].mean())
    assert "| flip | 3 |" in capsys.readouterr().out


def test_target_scores_equal_a_hand_computed_log_softmax_at_any_batch_size():
    """target_scores on the shipped embedded model: NLL is the mean over tokens of -log_softmax of the
    true class's teacher-forced logits, the prediction the class of highest total log-likelihood; the
    batch size changes neither (5 images: batches of 2 leave a remainder; the default's batch holds all 5)."""
    model = load_model("embedded")
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 1024, (5, 64), generator=g)
    labels = [3, 7, 0, 9, 3]
    frame = pd.DataFrame({"image": range(5), "condition": labels, "codes": list(codes.numpy())})
    every = []
    for c in range(10):
        with torch.no_grad():
            logits = model.teacher_force(model.make_prompt([c] * 5, guided=False), codes).logits.double()
        every.append(torch.log_softmax(logits, -1).gather(-1, codes[..., None])[..., 0].sum(-1))
    every = torch.stack(every, 1)  # (5, 10) nats per image
    nll = -every[torch.arange(5), torch.tensor(labels)] / 64
    for batch in (None, 1, 2, 16):  # None: the CPU rule, 64 images of embedded's logits a pass
        got = target_scores(model, frame, batch_size=batch)
        assert got["nll"].to_numpy() == pytest.approx(nll.numpy(), abs=1e-4)
        assert list(got["predicted"]) == every.argmax(1).tolist()
        assert list(got["consistent"]) == [p == c for p, c in zip(every.argmax(1).tolist(), labels)]


def _generate_run(path: Path, codes: torch.Tensor, conditions, scores=None) -> Path:
    """The parts of a lantern.generate --out directory that session_scores reads (images in reverse
    order, as a merge may leave them), with an optional target_scores.csv."""
    path.mkdir(parents=True)
    n = len(codes)
    pd.DataFrame({"image": range(n), "condition": conditions, "codes": list(codes.numpy())}).iloc[::-1].to_parquet(
        path / "images.parquet"
    )
    if scores is not None:
        scores.to_csv(path / "target_scores.csv", index=False)
    return path


def test_scores_of_generate_runs_and_reused_target_scores(tmp_path, capsys):
    """A directory of generate runs (one per method) scores like a session: 'copy' has AR's tokens, so
    every difference is 0; --reuse-target-scores takes each run's target_scores.csv as it stands (here
    AR's NLL doubled, so its mean doubles and 'copy' differs by minus AR's mean), and a missing file is
    one line, exit 2."""
    model = load_model("embedded")
    ar = torch.randint(0, 1024, (3, 64), generator=torch.Generator().manual_seed(2))
    frame = pd.DataFrame({"image": [0, 1, 2], "condition": [1, 4, 8], "codes": list(ar.numpy())})
    direct = target_scores(model, frame)
    runs = tmp_path / "runs"
    _generate_run(runs / "ar", ar, [1, 4, 8], direct.assign(nll=2 * direct["nll"]))
    _generate_run(runs / "copy", ar.clone(), [1, 4, 8], direct)
    assert scores.main([str(runs), "--model", "embedded"]) == 0
    s = pd.read_csv(runs / "scores.csv").set_index("method")
    assert list(s.index) == ["ar", "copy"] and s.loc["copy", "target_nll_diff"] == 0.0
    assert s.loc["ar", "target_nll"] == pytest.approx(direct["nll"].mean(), abs=1e-6)
    assert scores.main([str(runs), "--model", "embedded", "--reuse-target-scores"]) == 0
    s = pd.read_csv(runs / "scores.csv").set_index("method")
    assert s.loc["ar", "target_nll"] == pytest.approx(2 * direct["nll"].mean(), abs=1e-6)
    assert s.loc["copy", "target_nll_diff"] == pytest.approx(-direct["nll"].mean(), abs=1e-6)
    capsys.readouterr()
    (runs / "copy" / "target_scores.csv").unlink()
    assert scores.main([str(runs), "--model", "embedded", "--reuse-target-scores"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "target_scores.csv is missing" in err[0]


def test_bad_session_is_one_line(tmp_path, capsys):
    assert scores.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "neither finished session rounds" in err[0]
    _session(tmp_path / "s", {"sd": torch.zeros(1, 64, dtype=torch.long)}, [0])
    assert scores.main([str(tmp_path / "s"), "--model", "embedded"]) == 2
    assert "no AR decodes" in capsys.readouterr().err


def test_quality_grid_figure_reads_fig5_and_the_scores(tmp_path, capsys):
    """scripts/figure_quality_grid.py: AR and EAGLE-2 at δ = 0, LANTERN rows of --k in δ order, the session
    scores merged by method name; a run without fig5 or without LANTERN rows at --k is one line, exit 2."""
    fig = load_script(Path(__file__).resolve().parents[1] / "scripts" / "figure_quality_grid.py")
    run = tmp_path / "run"
    (run / "fig5").mkdir(parents=True)
    names = [
        "ar",
        "eagle2",
        "lantern-k1000-d0.4",
        "lantern-k1000-d0.1",
        "lantern-random-k1000-d0.1",
        "lantern-k300-d0.1",
    ]
    df = pd.DataFrame(
        {
            "method": names,
            "name": names,
            "images": 8,
            "k_paper": [None, None, 1000, 1000, 1000, 300],
            "delta": [None, None, 0.4, 0.1, 0.1, 0.1],
            "bound": [None, None, "lantern", "lantern", "lantern", "lantern"],
            "metric": [None, None, "l2", "l2", "random", "l2"],
            "matrix": [None, None] + ["codebook"] * 4,
        }
    )
    for m in ("fid", "precision", "recall"):
        for suffix, v in (("", 0.5), ("_lo", 0.4), ("_hi", 0.6)):
            df[f"{m}_fmnist{suffix}"] = v
    df.to_csv(run / "fig5" / "fig5_ours.csv", index=False)
    sess = run / "sessions" / "embedded-16-T1"
    sess.mkdir(parents=True)
    sc = pd.DataFrame({"method": names, "images": 8})
    for m in scores.METRICS:
        for suffix in ("", "_lo", "_hi", "_diff", "_diff_lo", "_diff_hi"):
            sc[m + suffix] = range(len(names))
    sc.to_csv(sess / "scores.csv", index=False)
    assert fig.main([str(run), "--out", str(tmp_path / "f")]) == 0
    out = pd.read_csv(tmp_path / "f.csv")
    assert list(out["name"]) == ["ar", "eagle2", "lantern-k1000-d0.1", "lantern-k1000-d0.4"]
    assert list(out["delta"]) == [0.0, 0.0, 0.1, 0.4] and list(out["target_nll"]) == [0, 1, 3, 2]
    assert (tmp_path / "f.png").stat().st_size > 0 and (tmp_path / "f.pdf").is_file()
    capsys.readouterr()
    assert fig.main([str(run), "--k", "100", "--out", str(tmp_path / "g")]) == 2
    assert "no LANTERN rows at k = 100" in capsys.readouterr().err
    assert fig.main([str(tmp_path), "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--only fig5" in err[0]
    # a saved CSV is a source too; --compare draws a second model beside it and saves both, labelled
    other = tmp_path / "other.csv"
    out.assign(precision_fmnist=0.25, precision_fmnist_lo=0.2, precision_fmnist_hi=0.3).to_csv(other, index=False)
    assert fig.main([str(tmp_path / "f.csv"), "--label", "new", "--compare", str(other), "--compare-label", "old",
                     "--out", str(tmp_path / "two")]) == 0  # fmt: skip
    both = pd.read_csv(tmp_path / "two.csv")
    assert list(both["model"]) == ["new"] * 4 + ["old"] * 4
    assert list(both["precision_fmnist"]) == [0.5] * 4 + [0.25] * 4
    assert (tmp_path / "two.png").stat().st_size > 0
    capsys.readouterr()
    assert fig.main([str(tmp_path / "two.csv"), "--out", str(tmp_path / "h")]) == 2
    assert "holds two models" in capsys.readouterr().err
    assert fig.main([str(tmp_path / "f.csv"), "--compare", str(other), "--out", str(tmp_path / "f")]) == 2
    assert "would overwrite an input CSV" in capsys.readouterr().err
    assert fig.main([str(tmp_path / "missing.csv"), "--out", str(tmp_path / "h")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_methods_picks_what_is_scored(tmp_path, capsys):
    ar = torch.zeros(2, 64, dtype=torch.long)
    session = _session(tmp_path / "s", {"ar": ar, "a": ar + 1, "b": ar + 2}, [1, 2])
    assert scores.main([str(session), "--model", "embedded", "--methods", "b"]) == 0
    assert list(pd.read_csv(session / "scores.csv")["method"]) == ["ar", "b"]
    capsys.readouterr()
    assert scores.main([str(session), "--model", "embedded", "--methods", "c"]) == 2
    assert "no method 'c'; choose from a, ar, b" in capsys.readouterr().err
