"""Training of the embedded model: the --quick smoke run end to end on a fake Fashion-MNIST,
resume after an interruption, and the small pieces (schedule, data order, metrics)."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from fake_data import load_script as _load_script
from fake_data import write_fake_fashion_mnist

from ambiguity.errors import UsageError
from ambiguity.generation import sample_tokens
from ambiguity.models.embedded import GPT_FILE, METRICS_FILE, VQ_FILE, load_embedded
from ambiguity.models.gpt import GPTConfig
from ambiguity.models.vq import VQConfig, VQModel
from ambiguity.sampling import SamplingConfig
from ambiguity.train import CURVE_FILE, EpochStopConfig, GPTTrainConfig, gpt_nll, stop_reason, train_gpt
from ambiguity.train_loop import batch_indices, epoch_ends, lr_at, steps_for_epochs
from ambiguity.train_vq import code_usage, reinit_dead_codes

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_embedded.py"
FIGURE = SCRIPT.with_name("figure_embedded_samples.py")


def load_script(path=SCRIPT):
    return _load_script(path)


@pytest.fixture
def fake_data(tmp_path):
    """A tiny Fashion-MNIST: 40 train / 20 test random 28x28 images, train gzipped, test not."""
    return write_fake_fashion_mnist(tmp_path / "data", 40, 20, seed=0, gzip_train=True)


def test_quick_run_end_to_end(fake_data, tmp_path, capsys):
    out, run = tmp_path / "w", tmp_path / "run"
    main = load_script().main
    argv = [
        "--quick",
        "--data",
        str(fake_data),
        "--out",
        str(out),
        "--run-dir",
        str(run),
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    assert "GPT test NLL" in capsys.readouterr().out
    m = json.loads((out / METRICS_FILE).read_text())
    assert m["seed"] == 0 and m["token_budget"] == 4 * 8 * 64 == m["gpt"]["token_budget"]
    assert m["vq"]["test"]["codebook_size"] == 64 and m["vq"]["test"]["images"] == 20
    t = m["vq"]["test"]
    assert t["psnr_db"] == pytest.approx(10 * math.log10(1 / t["mse"]))
    assert 0 < t["codebook_usage"] <= 1 and 1 <= t["code_perplexity"] <= 64
    assert m["gpt"]["test"]["tokens"] == 20 * 64
    assert m["files"][VQ_FILE] == (out / VQ_FILE).stat().st_size

    model = load_embedded(weights=out)
    assert model.grid == (8, 8) and model.num_classes == 10 and model.class_names[7] == "Sneaker"
    sampling = SamplingConfig(guidance=2.0, temperature=1.0)
    prompt = model.make_prompt([0, 3, 9], guided=sampling.guided)
    codes = sample_tokens(model, prompt, sampling, torch.Generator().manual_seed(0))
    assert codes.shape == (3, 64) and codes.dtype == torch.int64
    assert 0 <= int(codes.min()) and int(codes.max()) < 64
    images = model.decode_codes(codes.view(3, 8, 8))
    assert images.shape == (3, 1, 32, 32) and 0 <= float(images.min()) and float(images.max()) <= 1

    # Rerunning finds both stages done and rewrites nothing.
    before = (out / GPT_FILE).read_bytes()
    assert main(argv) == 0
    assert "already done" in capsys.readouterr().out
    assert (out / GPT_FILE).read_bytes() == before

    # The samples figure renders from these weights (2 test images per class in the fake set).
    fig = load_script(FIGURE).main
    assert (
        fig(
            [
                "--weights",
                str(out),
                "--data",
                str(fake_data),
                "--out",
                str(tmp_path / "fig"),
                "--n-real",
                "2",
                "--n-samples",
                "2",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert (tmp_path / "fig.png").stat().st_size > 0 and (tmp_path / "fig.pdf").stat().st_size > 0
    assert fig(["--weights", str(out), "--n-real", "0"]) == 2


def test_cli_errors_are_one_line(tmp_path, capsys):
    main = load_script().main
    assert main(["--quick", "--data", str(tmp_path / "none"), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Fashion-MNIST IDX files not found") and "\n" not in err
    assert main(["--quick", "--stage", "gpt", "--threads", "-1"]) == 2


def _tiny_gpt_setup():
    cfg = GPTConfig(dim=32, n_layer=1, n_head=2, multiple_of=32, num_classes=10, vocab_size=16, block_size=16)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 16, (24, 16), generator=g)
    labels = torch.arange(24) % 10
    return cfg, tokens, labels


def test_gpt_resume_after_interruption_matches_uninterrupted(tmp_path, monkeypatch):
    import ambiguity.train as T

    cfg, tokens, labels = _tiny_gpt_setup()
    train = GPTTrainConfig(steps=6, batch_size=4, warmup=2, ckpt_every=2)
    ref, ref_stats = train_gpt(cfg, train, tokens, labels, tmp_path / "a", 0, torch.device("cpu"), progress=False)

    calls = {"n": 0}
    real = T.gpt_loss

    def flaky(*a):
        calls["n"] += 1
        if calls["n"] == 4:  # dies during step 4; the step-2 checkpoint survives
            raise KeyboardInterrupt
        return real(*a)

    monkeypatch.setattr(T, "gpt_loss", flaky)
    with pytest.raises(KeyboardInterrupt):
        train_gpt(cfg, train, tokens, labels, tmp_path / "b", 0, torch.device("cpu"), progress=False)
    monkeypatch.setattr(T, "gpt_loss", real)
    logs = []
    resumed, stats = train_gpt(
        cfg, train, tokens, labels, tmp_path / "b", 0, torch.device("cpu"), progress=False, log=logs.append
    )
    assert logs[0] == "resuming GPT training at step 2/6"
    assert [line.split()[1] for line in logs[1:]] == ["4/6", "6/6"]  # a line per checkpoint
    for (k, a), b in zip(ref.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k
    assert stats["token_budget"] == ref_stats["token_budget"] == 6 * 4 * 16

    with pytest.raises(UsageError, match="--fresh"):  # another recipe in the same run dir
        train_gpt(
            cfg,
            GPTTrainConfig(steps=7, batch_size=4),
            tokens,
            labels,
            tmp_path / "b",
            0,
            torch.device("cpu"),
            progress=False,
        )


def test_untrained_gpt_nll_is_log2_vocab():
    # The output head starts at zero, so every next-token distribution is uniform over 16 codes.
    from ambiguity.models.gpt import GPT

    cfg, tokens, labels = _tiny_gpt_setup()
    r = gpt_nll(GPT(cfg), tokens, labels, batch_size=7, progress=False)
    assert r["nll_bits_per_token"] == pytest.approx(4.0, abs=1e-6)
    assert r["nll_nats_per_token"] == pytest.approx(math.log(16), abs=1e-6) and r["tokens"] == 24 * 16


def test_lr_schedule_values():
    assert lr_at(0, 1.0, 4, 104, 0.1) == pytest.approx(0.25)
    assert lr_at(3, 1.0, 4, 104, 0.1) == pytest.approx(1.0)
    assert lr_at(4, 1.0, 4, 104, 0.1) == pytest.approx(1.0)
    assert lr_at(54, 1.0, 4, 104, 0.1) == pytest.approx(0.55)  # half way: 0.1 + 0.9 * 0.5
    assert lr_at(104, 1.0, 4, 104, 0.1) == pytest.approx(0.1)


def test_batch_indices_cover_each_epoch_once_and_are_stateless():
    n, b = 10, 4
    seq = torch.cat([batch_indices(s, b, n, seed=3) for s in range(5)])  # 20 = two epochs
    assert sorted(seq[:10].tolist()) == list(range(10)) and sorted(seq[10:].tolist()) == list(range(10))
    assert torch.equal(batch_indices(2, b, n, 3), seq[8:12])  # step 2 straddles the epoch boundary
    assert not torch.equal(batch_indices(0, b, n, 4), batch_indices(0, b, n, 3))


def test_code_usage_hand_computed():
    u = code_usage(torch.tensor([0, 0, 1, 1]), 4)
    assert u == {"fraction_used": 0.5, "perplexity": pytest.approx(2.0)}
    u = code_usage(torch.tensor([[0, 0], [0, 1]]), 8)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert u["fraction_used"] == 0.25 and u["perplexity"] == pytest.approx(math.exp(h))


def test_reinit_dead_codes_restarts_only_stale_codes():
    torch.manual_seed(0)
    vq = VQModel(
        VQConfig(
            codebook_size=6,
            codebook_embed_dim=4,
            encoder_ch_mult=[1, 2],
            decoder_ch_mult=[1, 2],
            z_channels=32,
            ch=32,
            num_res_blocks=1,
            in_channels=1,
        )
    )
    w0 = vq.quantize.embedding.weight.detach().clone()
    last_used = torch.tensor([10, 3, 9, 0, 10, 5])
    pool = torch.nn.functional.normalize(torch.randn(50, 4), dim=-1)
    n = reinit_dead_codes(vq, last_used, step=10, dead_after=5, pool=pool)
    assert n == 3  # codes 1, 3, 5 unused for >= 5 steps
    w = vq.quantize.embedding.weight.detach()
    assert torch.equal(w[[0, 2, 4]], w0[[0, 2, 4]])
    for i in (1, 3, 5):
        assert (w[i] - pool).norm(dim=1).min() < 0.05  # a pool vector plus 1% noise
    assert last_used.tolist() == [10, 10, 9, 10, 10, 10]


# ----------------------------------------------------------------- embedded-16-long: epochs, curve, early stop
def test_epoch_boundaries_and_step_budget():
    # 10 sequences, batches of 4: steps 1-3 cover sequences 0-11, so step 3 ends epoch 1, step 5 epoch 2.
    assert [s for s in range(1, 11) if epoch_ends(s, 4, 10)] == [3, 5, 8, 10]
    # quarters of a pass over 10 sequences end at 2.5, 5, 7.5, 10, 12.5, ... sequences: every step of 4 ends one
    assert [s for s in range(1, 6) if epoch_ends(s, 4, 10, per_epoch=4)] == [1, 2, 3, 4, 5]
    assert [s for s in range(1, 9) if epoch_ends(s, 2, 16, per_epoch=4)] == [2, 4, 6, 8]
    assert steps_for_epochs(2, 10, 4) == 5 and steps_for_epochs(6, 60000, 32) == 11250
    assert steps_for_epochs(1.9, 60000, 32) == 3563  # 3562.5 rounded up


def test_stop_reason_hand_values():
    rule = EpochStopConfig(min_gain_bits=0.02, min_epochs=1.9)
    rows = [{"epoch": 1.0, "test_nll_bits": 5.0}]
    assert stop_reason(rows, rule) is None  # nothing to compare with
    assert stop_reason([{"epoch": 1.0, "test_nll_bits": 5.0}, {"epoch": 1.5, "test_nll_bits": 5.0}], rule) is None
    rows.append({"epoch": 2.0, "test_nll_bits": 4.97})  # gains 0.03 bits/token per epoch: go on
    assert stop_reason(rows, rule) is None
    rows.append({"epoch": 3.0, "test_nll_bits": 4.96})  # gains 0.01: stop
    assert "0.0100 bits/token per epoch from epoch 2.00 to 3.00" in stop_reason(rows, rule)
    half = [{"epoch": 2.0, "test_nll_bits": 4.0}, {"epoch": 2.5, "test_nll_bits": 3.995}]  # 0.01 per epoch
    assert stop_reason(half, rule) is None  # but over half an epoch: not judged yet
    # a warm restart's first quarter (measured: the warmup to the peak lr raised the NLL 3.424 -> 3.869)
    restart = [{"epoch": 1.98, "test_nll_bits": 3.424}, {"epoch": 2.23, "test_nll_bits": 3.869}]
    assert stop_reason(restart, rule) is None
    restart += [{"epoch": 1.98 + i / 4, "test_nll_bits": 3.869 - 0.15 * (i - 1)} for i in range(2, 5)]
    assert stop_reason(restart[:-1], rule) is None  # 2.73: still no row a full epoch older
    assert "from epoch 1.98 to 2.98" in stop_reason(restart, rule)  # a full epoch gained 0.005 bits: stop
    assert stop_reason([{"epoch": 2.0, "test_nll_bits": 4.0}, {"epoch": 3.0, "test_nll_bits": 4.1}], rule) is not None
    # Several evaluations per epoch: the gain is measured over the last full epoch, not the last quarter.
    quarters = [{"epoch": 0.5 + i / 4, "test_nll_bits": 5.0 - 0.1 * i} for i in range(6)]  # 0.4 bits/epoch
    quarters.append({"epoch": 2.25, "test_nll_bits": quarters[-1]["test_nll_bits"] - 0.001})  # a flat last quarter
    assert stop_reason(quarters, rule) is None  # 1.25 -> 2.25 gained 0.201 bits
    late = [{"epoch": 0.48, "test_nll_bits": 5.0}, {"epoch": 1.23, "test_nll_bits": 4.5}]
    late.append({"epoch": 1.98, "test_nll_bits": 4.495})  # 0.98 is not there: compare with 0.48 -> 0.337/epoch
    assert stop_reason(late, rule) is None
    late[-1]["test_nll_bits"] = 4.99  # 0.01 bits over 1.5 epochs
    assert "from epoch 0.48 to 1.98" in stop_reason(late, rule)


def test_gpt_epoch_curve_resumes_exactly(tmp_path, monkeypatch):
    import ambiguity.train as T

    cfg, tokens, labels = _tiny_gpt_setup()  # 24 sequences, batches of 4: 6 steps per epoch
    train = GPTTrainConfig(steps=steps_for_epochs(3, 24, 4), batch_size=4, warmup=2, ckpt_every=5)
    never = EpochStopConfig(min_gain_bits=-1e9)

    def evaluate(model):
        assert not model.training
        return gpt_nll(model, tokens[:8], labels[:8], progress=False)["nll_bits_per_token"]

    ref, ref_stats = train_gpt(
        cfg,
        train,
        tokens,
        labels,
        tmp_path / "a",
        0,
        torch.device("cpu"),
        progress=False,
        evaluate=evaluate,
        stop=never,
    )
    assert [(r["epoch"], r["step"]) for r in ref_stats["curve"]] == [(1.0, 6), (2.0, 12), (3.0, 18)]
    assert ref_stats["stop_reason"] == "step budget reached (18 steps)" and ref_stats["steps"] == 18
    assert ref_stats["curve"][-1]["test_nll_bits"] == pytest.approx(evaluate(ref))
    for r in ref_stats["curve"]:
        assert r["train_loss_bits"] == pytest.approx(r["train_loss_nats"] / math.log(2))
        assert r["lr"] == pytest.approx(lr_at(r["step"] - 1, 1e-3, 2, 18, 0.1))

    calls = {"n": 0}
    real = T.gpt_loss

    def flaky(*a):
        calls["n"] += 1
        if calls["n"] == 14:  # dies during step 14; the checkpoint after the epoch-2 evaluation (step 12) survives
            raise KeyboardInterrupt
        return real(*a)

    monkeypatch.setattr(T, "gpt_loss", flaky)
    with pytest.raises(KeyboardInterrupt):
        train_gpt(
            cfg,
            train,
            tokens,
            labels,
            tmp_path / "b",
            0,
            torch.device("cpu"),
            progress=False,
            evaluate=evaluate,
            stop=never,
        )
    monkeypatch.setattr(T, "gpt_loss", real)
    logs = []
    resumed, stats = train_gpt(
        cfg,
        train,
        tokens,
        labels,
        tmp_path / "b",
        0,
        torch.device("cpu"),
        progress=False,
        log=logs.append,
        evaluate=evaluate,
        stop=never,
    )
    assert logs[0] == "resuming GPT training at step 12/18"
    assert sum(line.startswith("epoch ") for line in logs) == 1  # only epoch 3 is evaluated after the resume
    for (k, a), b in zip(ref.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k
    keys = ("epoch", "step", "test_nll_bits", "train_loss_nats", "lr")
    assert [[r[k] for k in keys] for r in stats["curve"]] == [[r[k] for k in keys] for r in ref_stats["curve"]]

    with pytest.raises(UsageError, match="--fresh"):  # another stop rule in the same run dir
        train_gpt(
            cfg,
            train,
            tokens,
            labels,
            tmp_path / "b",
            0,
            torch.device("cpu"),
            progress=False,
            evaluate=evaluate,
            stop=EpochStopConfig(),
        )


def test_gpt_early_stop_after_small_gain(tmp_path):
    cfg, tokens, labels = _tiny_gpt_setup()
    train = GPTTrainConfig(steps=steps_for_epochs(5, 24, 4), batch_size=4, warmup=2, ckpt_every=4)
    nll = iter([5.0, 4.9, 4.89, 4.0, 3.0])  # gains 0.1 then 0.01 bits/token per epoch

    model, stats = train_gpt(
        cfg,
        train,
        tokens,
        labels,
        tmp_path,
        0,
        torch.device("cpu"),
        progress=False,
        log=lambda s: None,
        evaluate=lambda m: next(nll),
        stop=EpochStopConfig(0.02, 1.9),
    )
    assert stats["steps"] == 18 and stats["max_steps"] == 30 and stats["epochs"] == 3.0
    assert stats["token_budget"] == 18 * 4 * 16
    assert [r["test_nll_bits"] for r in stats["curve"]] == [5.0, 4.9, 4.89]
    assert stats["stop_reason"].startswith("test NLL improved by 0.0100 bits/token per epoch from epoch 2.00 to 3.00")
    curve = json.loads((tmp_path / CURVE_FILE).read_text())
    assert curve["rows"] == stats["curve"] and curve["stop_reason"] == stats["stop_reason"]
    assert curve["max_steps"] == 30 and curve["train_sequences"] == 24
    # A rerun finds the stopped run: no further steps, no evaluation.
    again, stats2 = train_gpt(
        cfg,
        train,
        tokens,
        labels,
        tmp_path,
        0,
        torch.device("cpu"),
        progress=False,
        log=lambda s: None,
        evaluate=lambda m: pytest.fail("evaluated again"),
        stop=EpochStopConfig(0.02, 1.9),
    )
    assert stats2["steps"] == 18 and stats2["curve"] == stats["curve"]
    for a, b in zip(model.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)


def test_long_recipe_script_stages_weights_and_curve(fake_data, tmp_path, capsys):
    from ambiguity.models.checkpoints import save_module
    from ambiguity.models.embedded import GPT16_FILE, METRICS16_FILE, VQ16_FILE, VQ_SKIP, WEIGHTS_DIR
    from ambiguity.train import embedded16_long_recipe

    vq_cfg = embedded16_long_recipe(quick=True)[0]
    out, run = tmp_path / "stage", tmp_path / "run"
    out.mkdir()
    torch.manual_seed(0)
    save_module(VQModel(vq_cfg), vq_cfg, out / VQ16_FILE, skip=VQ_SKIP)  # an untrained quick VQ: no VQ training
    main = load_script().main
    argv = [
        "--quick",
        "--recipe",
        "embedded-16-long",
        "--stage",
        "gpt",
        "--epochs",
        "2",
        "--eval-images",
        "8",
        "--evals-per-epoch",
        "1",
        "--data",
        str(fake_data),
        "--out",
        str(out),
        "--run-dir",
        str(run),
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "GPT stopped" in text and "test NLL after epoch 2.00" in text
    curve = json.loads((run / CURVE_FILE).read_text())
    assert curve["eval_images"] == 8 and curve["max_epochs"] == 2.0 and curve["train_sequences"] == 40
    # 40 sequences, batches of 8; the row at step 0 is the init's NLL (no train loss yet)
    assert [(r["epoch"], r["step"]) for r in curve["rows"]] == [(0.0, 0), (1.0, 5), (2.0, 10)]
    assert curve["rows"][0]["train_loss_bits"] is None and curve["rows"][0]["lr"] == 0.0
    assert curve["stop_reason"] == "step budget reached (10 steps)"  # the gain after epoch 2 was large enough
    m = json.loads((out / METRICS16_FILE).read_text())["gpt"]
    assert m["steps"] == 10 and m["stop_reason"] == "step budget reached (10 steps)" and m["eval_images"] == 8
    assert m["stop"] == {"min_gain_bits": 0.02, "min_epochs": 1.9, "evals_per_epoch": 1, "eval_at_start": True}
    assert m["test"]["tokens"] == 20 * 256
    assert (out / GPT16_FILE).is_file()
    # The curve figure renders from the run dir (also from a partial curve: one row).
    fig = load_script(SCRIPT.with_name("figure_training_curve.py")).main
    assert fig(["--run-dir", str(run), "--out", str(tmp_path / "curve")]) == 0
    assert (tmp_path / "curve.png").stat().st_size > 0
    curve["rows"] = curve["rows"][:1]
    (run / CURVE_FILE).write_text(json.dumps(curve))
    assert fig(["--run-dir", str(run), "--out", str(tmp_path / "partial"), "--no-reference"]) == 0
    assert fig(["--run-dir", str(tmp_path)]) == 2 and "not found" in capsys.readouterr().err
    # a warm restart joins on: its step-0 row (the previous run's last model) is dropped, the restart marked
    (tmp_path / "r2").mkdir()
    rows = [dict(curve["rows"][0]), {**curve["rows"][0], "epoch": 1.5}]
    later = {**curve, "init_from": {"epochs": 0.0}, "rows": rows}
    (tmp_path / "r2" / CURVE_FILE).write_text(json.dumps(later))
    assert fig(["--run-dir", str(run), "--run-dir", str(tmp_path / "r2"), "--out", str(tmp_path / "j")]) == 0
    joined = pd.read_csv(tmp_path / "j.csv")
    assert joined["epoch"].tolist() == [0.0, 1.5] and joined["run_dir"].tolist() == [str(run), str(tmp_path / "r2")]
    assert fig(["--run-dir", str(tmp_path / "r2"), "--run-dir", str(run), "--out", str(tmp_path / "k")]) == 2
    assert "pass the --run-dir in training order" in capsys.readouterr().err
    # an earlier joined CSV (its run dirs gone) continued by a restart; its rows of that restart give way
    (tmp_path / "r3").mkdir()
    third = {**curve, "init_from": {"epochs": 1.5}, "rows": [{**rows[0], "epoch": 1.5}, {**rows[0], "epoch": 2.5}]}
    (tmp_path / "r3" / CURVE_FILE).write_text(json.dumps(third))
    for _ in range(2):  # the second call reads its own output: the same rows, none doubled
        argv = ["--earlier", str(tmp_path / "j.csv"), "--run-dir", str(tmp_path / "r3"), "--out", str(tmp_path / "j")]
        assert fig(argv) == 0
        joined = pd.read_csv(tmp_path / "j.csv")
        assert joined["epoch"].tolist() == [0.0, 1.5, 2.5]
        assert joined["run_dir"].tolist() == [str(run), str(tmp_path / "r2"), str(tmp_path / "r3")]
    pd.DataFrame({"epoch": [0.0]}).to_csv(tmp_path / "bad.csv", index=False)
    assert fig(["--earlier", str(tmp_path / "bad.csv"), "--run-dir", str(run)]) == 2
    assert "lacks columns ['run_dir', 'step', 'test_nll_bits']" in capsys.readouterr().err
    # The flags belong to the long recipe; the shipped directory is refused as its --out.
    assert main(["--quick", "--epochs", "2", "--data", str(fake_data), "--run-dir", str(run)]) == 2
    assert "only applies to --recipe embedded-16-long" in capsys.readouterr().err
    assert (
        main(
            [
                "--quick",
                "--recipe",
                "embedded-16-long",
                "--stage",
                "gpt",
                "--data",
                str(fake_data),
                "--out",
                str(WEIGHTS_DIR),
                "--run-dir",
                str(run),
            ]
        )
        == 2
    )
    assert "staging directory" in capsys.readouterr().err


def test_long_recipe_warm_restart_from_a_snapshot(fake_data, tmp_path, capsys):
    """--snapshot writes the run's latest model with its epochs; --init-from continues from it,
    counting epochs on from there (curve rows, stop rule, metrics)."""
    from ambiguity.io import load_tensors, save_tensors
    from ambiguity.models.checkpoints import save_module
    from ambiguity.models.embedded import GPT16_FILE, METRICS16_FILE, VQ16_FILE, VQ_SKIP
    from ambiguity.train import embedded16_long_recipe

    vq_cfg = embedded16_long_recipe(quick=True)[0]
    main = load_script().main
    common = ["--quick", "--recipe", "embedded-16-long", "--stage", "gpt", "--eval-images", "8", "--data"]
    common += [str(fake_data), "--no-progress", "--device", "cpu"]
    for name in ("a", "b"):
        (tmp_path / name / "stage").mkdir(parents=True)
        torch.manual_seed(0)
        save_module(VQModel(vq_cfg), vq_cfg, tmp_path / name / "stage" / VQ16_FILE, skip=VQ_SKIP)
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(common + ["--epochs", "1", "--out", str(a / "stage"), "--run-dir", str(a / "run")]) == 0
    snap = tmp_path / "new" / "dir" / "snap.safetensors"  # its directory is created
    assert main(common + ["--run-dir", str(a / "run"), "--snapshot", str(snap)]) == 0
    assert "step 5, 1.000 epochs" in capsys.readouterr().out
    assert (snap.stat().st_mode & 0o777) == 0o666 & ~_umask()
    (tmp_path / "file").write_text("")
    assert main(common + ["--run-dir", str(a / "run"), "--snapshot", str(tmp_path / "file" / "s.safetensors")]) == 2
    assert "cannot create the directory of --snapshot" in capsys.readouterr().err
    assert main(common + ["--run-dir", str(a / "run"), "--snapshot", str(snap), "--init-from", str(snap)]) == 2
    assert "drop --init-from" in capsys.readouterr().err
    # --fresh with --snapshot is refused before anything in the run dir is deleted.
    kept = {f: (a / "run" / f).read_bytes() for f in ("gpt_ckpt.pt", "tokens_train.pt", "tokens_test.pt", CURVE_FILE)}
    assert main(common + ["--run-dir", str(a / "run"), "--snapshot", str(snap), "--fresh"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --fresh would delete the checkpoint --snapshot writes out; drop --fresh"
    )
    assert all((a / "run" / f).read_bytes() == v for f, v in kept.items())
    # A --quick run snapshotted without --quick: one line naming the fix, not a size-mismatch traceback.
    full = [x for x in common if x != "--quick"]
    assert main(full + ["--run-dir", str(a / "run"), "--snapshot", str(tmp_path / "s.safetensors")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {a / 'run'} holds a --quick run (its GPT config differs); add --quick"
    )
    assert not (tmp_path / "s.safetensors").exists()
    (b / "run").mkdir()
    (b / "stage" / VQ16_FILE).write_bytes((a / "stage" / VQ16_FILE).read_bytes())  # the same VQ file (hash)
    for f in ("tokens_train.pt", "tokens_test.pt"):  # so its token caches carry over to the new run dir
        (b / "run" / f).write_bytes((a / "run" / f).read_bytes())
    shipped, meta = load_tensors(a / "stage" / GPT16_FILE)
    snapped, snap_meta = load_tensors(snap)
    assert meta["epochs"] == snap_meta["epochs"] == 1.0
    # the files are embedded-16's (the model the recipe trains), so they load once shipped
    assert (meta["variant"], meta["recipe"]) == (snap_meta["variant"], snap_meta["recipe"])
    assert (meta["variant"], meta["recipe"]) == ("embedded-16", "embedded-16-long")
    assert load_embedded(weights=a / "stage", variant="embedded-16").name == "embedded-16"
    # files written before the recipe was recorded apart carry its name as their variant: still embedded-16's
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / VQ16_FILE).write_bytes((a / "stage" / VQ16_FILE).read_bytes())
    save_tensors(shipped, legacy / GPT16_FILE, {**meta, "variant": "embedded-16-long"})
    assert load_embedded(weights=legacy, variant="embedded-16").name == "embedded-16"
    with pytest.raises(UsageError, match="holds embedded-16 weights .* under embedded's file names"):
        (legacy / "fashion_vq.safetensors").write_bytes((legacy / VQ16_FILE).read_bytes())
        (legacy / "fashion_gpt.safetensors").write_bytes((legacy / GPT16_FILE).read_bytes())
        load_embedded(weights=legacy, variant="embedded")
    assert all(torch.equal(shipped[k], snapped[k]) for k in shipped)  # the same final model, both fp16
    assert (
        main(
            common
            + ["--epochs", "1", "--out", str(b / "stage"), "--run-dir", str(b / "run")]
            + ["--init-from", str(snap)]
        )
        == 0
    )
    assert "tokenize" not in capsys.readouterr().out
    curve = json.loads((b / "run" / CURVE_FILE).read_text())
    # the warm start's own NLL at 1.0 epochs, then 4 evaluations per epoch (40 sequences, batches of 8:
    # the quarter boundaries at 10, 20, 30, 40 sequences fall in steps 2, 3, 4, 5)
    assert [(r["epoch"], r["step"]) for r in curve["rows"]] == [(1.0, 0), (1.4, 2), (1.6, 3), (1.8, 4), (2.0, 5)]
    assert curve["init_from"]["epochs"] == 1.0
    assert (curve["max_epochs"], curve["max_total_epochs"]) == (1.0, 2.0)  # this run's, and with the init's
    m = json.loads((b / "stage" / METRICS16_FILE).read_text())["gpt"]
    assert (m["epochs"], m["epochs_this_run"], m["init_epochs"]) == (2.0, 1.0, 1.0)
    # With no steps to take, the warm-started model is the snapshot itself (fp16 -> fp32 exactly).
    from dataclasses import replace

    from ambiguity.train import train_gpt

    _, _, gpt_cfg, gpt_train = embedded16_long_recipe(quick=True)[:4]
    tokens, labels = torch.zeros(8, 256, dtype=torch.long), torch.zeros(8, dtype=torch.long)
    model, stats = train_gpt(
        gpt_cfg, replace(gpt_train, steps=0), tokens, labels, tmp_path / "c", 0, "cpu", False, init=("t", snapped, 1.0)
    )
    assert all(torch.equal(v, snapped[k].float()) for k, v in model.state_dict().items() if k in snapped)
    assert stats["epochs"] == 1.0 and stats["epochs_this_run"] == 0.0
    assert main(common + ["--epochs", "1", "--run-dir", str(b / "run"), "--init-epochs", "3"]) == 2
    assert "--init-epochs needs --init-from" in capsys.readouterr().err
    assert main(common + ["--run-dir", str(tmp_path / "none"), "--snapshot", str(snap)]) == 2
    assert "train first" in capsys.readouterr().err


def test_init_from_is_checked_before_any_tokenizing(fake_data, tmp_path, capsys, monkeypatch):
    """A wrong --init-from fails in seconds, before the VQ, the data or the token caches are touched."""
    from ambiguity.models.checkpoints import save_module
    from ambiguity.models.gpt import GPT
    from ambiguity.train import embedded16_long_recipe

    script = load_script()
    for name in ("cached_tokens", "load_split", "load_vq", "run_vq"):
        monkeypatch.setattr(script, name, lambda *a, **k: pytest.fail("work before --init-from was checked"))
    common = ["--quick", "--recipe", "embedded-16-long", "--data", str(fake_data), "--no-progress"]
    common += ["--run-dir", str(tmp_path / "run"), "--device", "cpu", "--init-from"]
    assert script.main(common + [str(tmp_path / "typo.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --init-from {tmp_path / 'typo.safetensors'} does not exist; pass a GPT weights file"
    other = GPTConfig(dim=32, n_layer=1, n_head=2, multiple_of=32, num_classes=10, vocab_size=16, block_size=16)
    save_module(GPT(other), other, tmp_path / "other.safetensors", epochs=1.0)
    assert script.main(common + [str(tmp_path / "other.safetensors")]) == 2
    assert "its config differs" in capsys.readouterr().err
    gpt_cfg = embedded16_long_recipe(quick=True)[2]
    save_module(GPT(gpt_cfg), gpt_cfg, tmp_path / "noepochs.safetensors")
    assert script.main(common + [str(tmp_path / "noepochs.safetensors")]) == 2
    assert "pass --init-epochs" in capsys.readouterr().err


def test_long_recipe_flags_named_with_the_right_verb(fake_data, tmp_path, capsys):
    main = load_script().main
    base = ["--quick", "--data", str(fake_data), "--run-dir", str(tmp_path / "run")]
    assert main(base + ["--epochs", "2"]) == 2
    assert capsys.readouterr().err.strip() == "error: --epochs only applies to --recipe embedded-16-long"
    assert main(base + ["--epochs", "2", "--min-epochs", "1"]) == 2
    assert "--epochs, --min-epochs only apply to --recipe" in capsys.readouterr().err


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_token_cache_resumes_after_its_last_chunk(tmp_path, capsys):
    from ambiguity.train import embedded16_long_recipe
    from ambiguity.train_loop import save_checkpoint

    script = load_script()
    torch.manual_seed(0)
    vq = VQModel(embedded16_long_recipe(quick=True)[0]).eval()
    images = torch.rand(7, 1, 64, 64)
    whole, _ = script.cached_tokens(vq, images, tmp_path / "a.pt", "sha", False, "t", chunk=100)
    chunked, _ = script.cached_tokens(vq, images, tmp_path / "b.pt", "sha", False, "t", chunk=3)
    assert whole.shape == (7, 256) and torch.equal(whole, chunked)
    assert "t: 6/7 images" in capsys.readouterr().out
    # An interrupted cache (first 3 images) resumes there; a cache of another VQ is recomputed.
    save_checkpoint(tmp_path / "c.pt", vq_sha="sha", codes=whole[:3].short(), n=7, time_s=1.0)
    resumed, _ = script.cached_tokens(vq, images, tmp_path / "c.pt", "sha", False, "t", chunk=3)
    assert torch.equal(resumed, whole) and "t: resuming at image 3/7" in capsys.readouterr().out
    save_checkpoint(tmp_path / "d.pt", vq_sha="other", codes=torch.zeros(7, 256, dtype=torch.int16), time_s=1.0)
    assert torch.equal(script.cached_tokens(vq, images, tmp_path / "d.pt", "sha", False, "t")[0], whole)


def test_long_recipe_trains_only_the_gpt_and_quick_trains_its_own_vq(fake_data, tmp_path, capsys):
    """--recipe embedded-16-long: --stage vq/all refused (its default is gpt); with --quick and no VQ
    in the staging directory it trains a quick 64-code VQ there instead of copying the shipped one."""
    from ambiguity.models.embedded import GPT16_FILE, VQ16_FILE

    main = load_script().main
    out, run = tmp_path / "stage", tmp_path / "run"
    base = ["--quick", "--recipe", "embedded-16-long", "--data", str(fake_data), "--no-progress", "--device", "cpu"]
    base += ["--out", str(out), "--run-dir", str(run)]
    for stage in ("vq", "all"):
        assert main(base + ["--stage", stage]) == 2
        assert capsys.readouterr().err.strip() == (
            f"error: --recipe embedded-16-long trains only the GPT on the shipped VQ; drop --stage {stage} "
            "(--recipe embedded-16 retrains the VQ)"
        )
    assert not (run / "vq_ckpt.pt").exists() and not (out / VQ16_FILE).exists()
    assert main(base + ["--epochs", "1", "--eval-images", "8"]) == 0
    text = capsys.readouterr().out
    assert f"--quick: training a quick VQ into {out}" in text and "copied the shipped VQ" not in text
    from ambiguity.models.embedded import load_vq

    vq, _ = load_vq(out / VQ16_FILE, "cpu")
    assert vq.config.codebook_size == 64 and (out / GPT16_FILE).is_file()
    m = json.loads((run / "gpt_done.json").read_text())["metrics"]
    assert m["steps"] == 5 and m["test"]["tokens"] == 20 * 256


def test_study_script_help_errors_and_ship_refusals(tmp_path):
    """scripts/embedded16_study.sh: --help/-h/help exit 0; refusals are one `error: ` line, exit 2,
    with no `== step` header; ship refuses a missing RUN and a run stopped on its step budget
    (printing the stop reason and epochs first) and copies nothing."""
    import os
    import shutil
    import subprocess

    study = SCRIPT.with_name("embedded16_study.sh")
    if shutil.which("bash") is None:
        pytest.skip("no bash")

    def run(*args, **env):
        r = subprocess.run(
            ["bash", str(study), *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=60
        )
        return r.returncode, r.stdout, r.stderr

    for h in ("--help", "-h", "help"):
        rc, out, _ = run(h)
        assert rc == 0 and out.startswith("Issue 23:") and "FORCE=1" in out
    steps = "train ship figures drafter compare sweep distortion quality grid paper snapshot"
    for args in (("ship", "all"), ("all", "ship")):
        assert run(*args)[::2] == (2, f"error: all runs every step; pass it alone or name steps ({steps})\n")
    rc, out, err = run("foo")
    assert (rc, out) == (2, "") and err == f"error: unknown step 'foo'; choose from: {steps}, or all alone\n"
    rc, out, err = run("ship", RUN=str(tmp_path / "none"))
    assert (rc, out) == (
        2,
        "",
    ) and err == f"error: RUN={tmp_path / 'none'} does not exist; set RUN to the training run dir\n"
    rc, out, err = run("ship", RUN=str(tmp_path))
    assert (rc, out) == (2, "") and "has not stopped yet (no gpt_done.json)" in err
    done = {"metrics": {"epochs": 1.98, "stop_reason": "step budget reached (2813 steps)"}}
    (tmp_path / "gpt_done.json").write_text(json.dumps(done))
    rc, out, err = run("ship", RUN=str(tmp_path), FORCE="")
    assert (rc, out) == (2, f"{tmp_path}: 1.98 epochs; stop: step budget reached (2813 steps)\n")
    why = "stopped on its step budget, not the stop rule (not converged); train on, or FORCE=1 to ship it"
    assert err == f"error: {tmp_path} {why}\n"
    rc, out, err = run("train", OLD_RUN=str(tmp_path / "none"), RUN=str(tmp_path / "new"))
    assert (rc, out) == (2, "") and err.startswith(f"error: OLD_RUN={tmp_path / 'none'} does not exist")
    assert not (tmp_path / "new").exists()


def test_study_script_ship_keeps_the_vq_metrics(tmp_path):
    """The ship step of a GPT-only run (FORCE=1 past a step-budget stop) copies the GPT and merges the
    metrics: the run's gpt section, the shipped file's vq section, the replaced GPT under gpt_before.
    Runs a copy of the script in a scratch tree, so the repository's shipped files are not touched."""
    import os
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    (root / "ambiguity" / "weights").mkdir(parents=True)
    shutil.copy(SCRIPT.with_name("embedded16_study.sh"), root / "scripts")
    shipped = {"vq": {"test": {"psnr_db": 34.1}}, "gpt": {"epochs": 0.48, "test": {"nll_bits_per_token": 5.25}}}
    (root / "ambiguity" / "weights" / "embedded16_metrics.json").write_text(json.dumps(shipped))
    run = root / "run"
    (run / "weights").mkdir(parents=True)
    (run / "weights" / "fashion16_gpt.safetensors").write_bytes(b"new gpt")
    new = {"gpt": {"epochs": 3.98, "test": {"nll_bits_per_token": 3.28}}, "token_budget": 1}
    (run / "weights" / "embedded16_metrics.json").write_text(json.dumps(new))
    done = {"metrics": {"epochs": 3.98, "stop_reason": "step budget reached (3750 steps)"}}
    (run / "gpt_done.json").write_text(json.dumps(done))
    r = subprocess.run(
        ["bash", str(root / "scripts" / "embedded16_study.sh"), "ship"],
        capture_output=True,
        text=True,
        env={**os.environ, "RUN": str(run), "FORCE": "1"},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert (root / "ambiguity" / "weights" / "fashion16_gpt.safetensors").read_bytes() == b"new gpt"
    got = json.loads((root / "ambiguity" / "weights" / "embedded16_metrics.json").read_text())
    assert got == {**new, "vq": shipped["vq"], "gpt_before": {"epochs": 0.48, "test": {"nll_bits_per_token": 5.25}}}


def test_study_script_grid_starts_from_an_earlier_grid_runs_rounds(tmp_path):
    """The grid step at a new GRID_IMAGES copies the earlier grid run's session with the most decoded
    rounds into the new run before lantern.paper starts, once; with PYTHON=true no command really runs."""
    import os
    import shutil
    import subprocess

    if shutil.which("bash") is None or shutil.which("true") is None:
        pytest.skip("no bash")
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT.with_name("embedded16_study.sh"), root / "scripts")
    old = root / "runs" / "paper" / "embedded16-grid64" / "sessions" / "embedded-16-T1" / "parts"
    old.mkdir(parents=True)
    (old / "round_00000.json").write_text("{}")
    (old / "round_00001.json").write_text("{}")
    fewer = root / "runs" / "paper" / "embedded16-grid100" / "sessions" / "embedded-16-T1" / "parts"
    fewer.mkdir(parents=True)
    (fewer / "round_00000.json").write_text("[]")

    def grid():
        env = {**os.environ, "PYTHON": "true", "GRID_IMAGES": "128"}
        r = subprocess.run(
            ["bash", str(root / "scripts" / "embedded16_study.sh"), "grid"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "reusing the rounds decoded in runs/paper/embedded16-grid64/sessions/embedded-16-T1" in grid()
    new = root / "runs" / "paper" / "embedded16-grid128" / "sessions" / "embedded-16-T1" / "parts"
    assert (new / "round_00000.json").read_text() == "{}"
    assert "reusing" not in grid()  # the new run has its session now


def test_study_script_distortion_step_runs_the_item_then_the_probe(tmp_path):
    """The distortion step runs the paper's distortion item (sampled drafts and the tree node) and then
    probe_emitted_tokens.py into the same run dir (PYTHON=echo prints the commands instead)."""
    import os
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    env = {**os.environ, "PYTHON": "echo"}
    r = subprocess.run(
        ["bash", str(SCRIPT.with_name("embedded16_study.sh")), "distortion"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    header, item, probe = r.stdout.strip().splitlines()
    assert header.startswith("== distortion")
    assert item.startswith("-m lantern.paper --models embedded-16,text-twin --only distortion")
    assert "--name embedded16-distortion" in item
    assert probe == (
        "benchmarks/probe_emitted_tokens.py --model embedded-16 --num-images 4 "
        "--out runs/paper/embedded16-distortion/emitted_tokens.csv"
    )
