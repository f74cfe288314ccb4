"""EAGLE drafter: input alignment, loss, accuracy, KV cache, files, training run and CLI (tiny models)."""

import hashlib
import json
import math

import numpy as np
import pytest
import torch
from reference.cache import OneImageCache

from ambiguity.errors import UsageError
from ambiguity.models.checkpoints import save_module
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.llamagen import LlamaGenModel
from ambiguity.runs import RunDir
from lantern.drafter.data import (
    TokenSet,
    build_feature_cache,
    iterate_batches,
    load_token_file,
    save_token_file,
    self_generate,
    split_holdout,
    teacher_forced_rows,
    training_inputs,
)
from lantern.drafter.model import Drafter, load_drafter, target_fingerprint
from lantern.drafter.objective import drafter_loss, evaluate, topk_accuracy, topk_hits
from lantern.drafter.train import TrainConfig, lr_at, train_drafter, train_step

N_TOK = 16  # 4 x 4 token grid
GPT_CFG = dict(dim=32, n_layer=2, n_head=2, vocab_size=64, block_size=N_TOK, num_classes=10, multiple_of=32)


def tiny_gpt(seed=0):
    torch.manual_seed(seed)
    gpt = GPT(GPTConfig(**GPT_CFG))
    torch.nn.init.normal_(gpt.output.weight, 0.0, 0.3)  # the official init zeroes the head: make logits informative
    return gpt.eval()


def tiny_model(seed=0, name="embedded"):
    return LlamaGenModel(tiny_gpt(seed), name=name)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def seqs(model):
    """40 sequences sampled from the tiny target (so the drafter has something learnable)."""
    from ambiguity.generation import sample_tokens
    from ambiguity.sampling import SamplingConfig

    labels = [i % 10 for i in range(40)]
    tokens = sample_tokens(
        model, model.make_prompt(labels), SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0)
    )
    return TokenSet(tokens, labels, "test")


# --------------------------------------------------------------------------- alignment
def test_training_inputs_shift_known_hidden_states():
    # hidden[r, t] = 100 r + t marks the teacher-forced position that predicts x_t (h_{t-1}).
    R, N, H = 2, 5, 3
    tokens = torch.arange(R * N).view(R, N)
    hidden = (100 * torch.arange(R)[:, None] + torch.arange(N)[None]).float()[..., None].expand(R, N, H)
    tok_in, feat_in, feat_tgt = training_inputs(tokens, hidden)
    assert tok_in.shape == (R, N - 1) and feat_in.shape == feat_tgt.shape == (R, N - 1, H)
    assert tok_in.tolist() == [[0, 1, 2, 3], [5, 6, 7, 8]]  # x_0 .. x_{N-2}
    assert feat_in[..., 0].tolist() == [[0, 1, 2, 3], [100, 101, 102, 103]]  # h_{-1} .. h_{N-3}
    assert feat_tgt[..., 0].tolist() == [[1, 2, 3, 4], [101, 102, 103, 104]]  # h_0 .. h_{N-2}


def test_training_inputs_match_incremental_decoding(model, seqs):
    """features_in[:, 0] is the prefill state (predicts x_0); feature_targets[:, i] is the state
    after feeding x_0..x_i, whose head predicts x_{i+1}: what the decoder hands the drafter."""
    tokens, labels = seqs.tokens[:3], seqs.conditions[:3]
    rows_t, hidden, unc = teacher_forced_rows(model, tokens, labels, torch.zeros(3, dtype=torch.bool))
    assert torch.equal(rows_t, tokens) and not unc.any() and hidden.shape == (3, N_TOK, 32)
    _, feat_in, feat_tgt = training_inputs(rows_t, hidden)
    prompt = model.make_prompt(labels)
    cache = OneImageCache(model, prompt, N_TOK)
    with torch.no_grad():
        first = cache.prefill()
        torch.testing.assert_close(feat_in[:, 0], first.hidden[:, 0], atol=1e-5, rtol=0)
        for i in range(N_TOK - 1):
            step = cache.extend(tokens[:, i : i + 1])
            torch.testing.assert_close(feat_tgt[:, i], step.hidden[:, 0], atol=1e-5, rtol=0)
            if i + 1 < N_TOK - 1:
                torch.testing.assert_close(feat_in[:, i + 1], step.hidden[:, 0], atol=1e-5, rtol=0)


def test_expand_rows_carry_the_unconditional_stream(model, seqs):
    tokens, labels = seqs.tokens[:4], seqs.conditions[:4]
    chosen = torch.tensor([False, True, False, True])
    rows_t, hidden, unc = teacher_forced_rows(model, tokens, labels, chosen)
    assert unc.tolist() == [False, False, False, False, True, True]
    assert torch.equal(rows_t, tokens[[0, 2, 1, 3, 1, 3]])
    prompt = model.make_prompt([labels[1], labels[3]], guided=True)  # rows: cond 1, cond 3, uncond 1, uncond 3
    with torch.no_grad():
        ref = model.teacher_force(prompt, torch.cat([tokens[[1, 3]], tokens[[1, 3]]])).hidden
    torch.testing.assert_close(hidden[2:], ref, atol=1e-5, rtol=0)
    assert not torch.allclose(hidden[4], hidden[2])  # the null condition changes the features


def test_feature_cache_uncond_fraction_and_resume(model, seqs, tmp_path):
    run = RunDir(tmp_path, {"test": "features"}, command="test").open()
    paths = build_feature_cache(model, seqs, run, "train", batch_size=16, uncond_fraction=0.3, seed=1, progress=False)
    rows = list(iterate_batches(paths, 1000))
    assert len(rows) == 1
    tokens, hidden, unc = rows[0]
    p = 0.3 / 0.7
    chosen = torch.rand(40, generator=torch.Generator().manual_seed(1)) < p
    assert int(unc.sum()) == int(chosen.sum()) and tokens.shape[0] == 40 + int(chosen.sum())
    assert hidden.dtype == torch.float16 and hidden.shape == (tokens.shape[0], N_TOK, 32)
    mtime = paths[0].stat().st_mtime_ns
    assert build_feature_cache(model, seqs, run, "train", 16, 0.3, 1, progress=False) == paths
    assert paths[0].stat().st_mtime_ns == mtime  # reused, not recomputed
    paths[0].write_bytes(paths[0].read_bytes()[:-10])  # a truncated shard is recomputed, not read
    assert build_feature_cache(model, seqs, run, "train", 16, 0.3, 1, progress=False) == paths
    assert torch.equal(next(iterate_batches(paths, 1000))[1], hidden)


# --------------------------------------------------------------------------- loss and metrics
def test_drafter_loss_hand_computed():
    pred = torch.tensor([[0.0, 0.0]])
    tgt = torch.tensor([[0.5, 2.0]])  # smooth L1: 0.5 * 0.5^2 = 0.125 and 2 - 0.5 = 1.5 -> mean 0.8125
    draft = torch.log(torch.tensor([[0.25, 0.25, 0.5]]))
    target = torch.log(torch.tensor([[0.5, 0.5, 1e-30]]))  # p = (1/2, 1/2, 0): CE = ln 4
    loss, l1, ce = drafter_loss(pred, tgt, draft, target, ce_weight=0.1)
    assert l1.item() == pytest.approx(0.8125, abs=1e-7)
    assert ce.item() == pytest.approx(math.log(4), abs=1e-6)
    assert loss.item() == pytest.approx(0.8125 + 0.1 * math.log(4), abs=1e-6)


def test_topk_accuracy_hand_made_logits():
    target = torch.tensor(
        [
            [0.0, 5.0, 1.0, 2.0, 3.0],  # top-1: 1
            [9.0, 1.0, 2.0, 3.0, 4.0],  # top-1: 0
            [1.0, 2.0, 3.0, 4.0, 9.0],  # top-1: 4
            [0.0, 1.0, 8.0, 2.0, 3.0],
        ]
    )  # top-1: 2
    draft = torch.tensor(
        [
            [0.0, 9.0, 1.0, 2.0, 3.0],  # rank of 1: 1st
            [5.0, 1.0, 2.0, 3.0, 9.0],  # rank of 0: 2nd
            [1.0, 2.0, 9.0, 8.0, 7.0],  # rank of 4: 3rd
            [9.0, 8.0, 0.0, 7.0, 6.0],
        ]
    )  # rank of 2: 5th
    assert topk_hits(draft, target).tolist() == [1, 2, 3]
    assert topk_accuracy(draft[None], target[None]) == {"top1": 0.25, "top2": 0.5, "top3": 0.75}


def test_topk_accuracy_equals_rank_counting():
    g = torch.Generator().manual_seed(0)
    draft, target = torch.randn(3, 100, 20, generator=g), torch.randn(3, 100, 20, generator=g)
    want = target.argmax(-1, keepdim=True)
    rank = (draft > draft.gather(-1, want)).sum(-1) + 1  # 1 = the drafter's favourite (no ties in randn)
    ours = topk_accuracy(draft, target)
    for k in (1, 2, 3):
        assert ours[f"top{k}"] == pytest.approx((rank <= k).float().mean().item(), abs=1e-7)
    assert 0 < ours["top1"] < ours["top2"] < ours["top3"] < 0.3


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, 110, cfg) == pytest.approx(1e-4)
    assert lr_at(9, 110, cfg) == pytest.approx(1e-3)
    assert lr_at(60, 110, cfg) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert lr_at(110, 110, cfg) == pytest.approx(1e-4)


def test_one_training_step_reduces_the_loss(model, seqs):
    tokens, hidden, _ = teacher_forced_rows(model, seqs.tokens[:16], seqs.conditions[:16], torch.zeros(16, dtype=bool))
    drafter = Drafter.for_target(model, dtype=torch.float32, seed=0)
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    head_before = model.gpt.output.weight.clone()
    cfg = TrainConfig(grad_clip=0.0)
    before = train_step(drafter, model, opt, tokens, hidden, cfg, lr=3e-3)
    with torch.no_grad():
        tok_in, f_in, f_tgt = training_inputs(tokens, hidden)
        pred = drafter(model, tok_in, f_in)
        after, _, _ = drafter_loss(pred, f_tgt, drafter.logits(model, pred), model.head(f_tgt))
    assert before["loss"] == pytest.approx(0.9242, abs=2e-3)  # seeded: tiny target, seed-0 drafter
    assert after.item() < before["loss"] - 0.01
    assert torch.equal(model.gpt.output.weight, head_before) and model.gpt.output.weight.grad is None
    assert model.gpt.tok_embeddings.weight.grad is None


# --------------------------------------------------------------------------- KV cache
def test_cached_chunks_equal_one_full_forward(model):
    drafter = Drafter.for_target(model, seed=3).eval()
    g = torch.Generator().manual_seed(0)
    rows = 4  # e.g. 2 images under CFG
    tokens = torch.randint(0, 64, (rows, N_TOK), generator=g)
    feats = torch.randn(rows, N_TOK, 32, generator=g)
    with torch.no_grad():
        full = drafter(model, tokens, feats, None, 0)
        cache = drafter.new_cache(rows)
        one = torch.cat([drafter(model, tokens[:, i : i + 1], feats[:, i : i + 1], cache, i) for i in range(N_TOK)], 1)
        torch.testing.assert_close(one, full, atol=1e-5, rtol=0)
        cache = drafter.new_cache(rows)
        parts, i = [], 0
        for n in (3, 5, 1, 7):
            parts.append(drafter(model, tokens[:, i : i + n], feats[:, i : i + n], cache, i))
            i += n
        torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)
        # draft 6 positions with wrong inputs, roll back to 4, rerun the true ones
        cache = drafter.new_cache(rows)
        drafter(model, tokens[:, :4], feats[:, :4], cache, 0)
        drafter(model, torch.zeros_like(tokens[:, 4:10]), torch.randn(rows, 6, 32, generator=g), cache, 4)
        drafter.rollback(cache, 4)
        rest = drafter(model, tokens[:, 4:], feats[:, 4:], cache, 4)
        torch.testing.assert_close(rest, full[:, 4:], atol=1e-5, rtol=0)
        assert drafter.logits(model, full).shape == (rows, N_TOK, 64)
        assert drafter.logits(model, full).dtype == torch.float32


# --------------------------------------------------------------------------- files
def test_save_load_round_trip(model, tmp_path):
    drafter = Drafter.for_target(model, dtype=torch.float32, seed=1).eval()
    g = torch.Generator().manual_seed(2)
    tokens, feats = torch.randint(0, 64, (2, 8), generator=g), torch.randn(2, 8, 32, generator=g)
    with torch.no_grad():
        ref = drafter(model, tokens, feats)
    path = drafter.save(tmp_path / "d.safetensors", dtype=torch.float32, note="x")
    back = Drafter.load(path, model)
    with torch.no_grad():
        assert torch.equal(back(model, tokens, feats), ref)
    assert back.target == target_fingerprint(model) and back.info["note"] == "x"
    half = Drafter.load(drafter.save(tmp_path / "h.safetensors"), model)  # fp16 file
    with torch.no_grad():
        torch.testing.assert_close(half(model, tokens, feats), ref, atol=2e-2, rtol=0)
    assert sorted(k.split(".")[0] for k in half.state_dict()) == ["fc"] * 2 + ["layer"] * 7  # no embedding / head


def test_a_drafter_file_is_refused_for_nan_weights_and_memory_is_named_as_memory(model, tmp_path, monkeypatch):
    """An all-NaN drafter would decode with τ = 1 and no error: refused naming the tensor. A
    MemoryError while reading a sound file is reported as memory, not as a damaged file."""
    import ambiguity.models.checkpoints as ck

    drafter = Drafter.for_target(model, dtype=torch.float32, seed=1)
    with torch.no_grad():
        for p in drafter.parameters():
            p.fill_(float("nan"))
    path = drafter.save(tmp_path / "nan.safetensors")
    with pytest.raises(UsageError, match=r"holds NaN or infinite values \(in fc\.weight\)"):
        Drafter.load(path, model)

    def no_memory(path, device="cpu"):
        raise MemoryError

    good = Drafter.for_target(model, dtype=torch.float32, seed=1).save(tmp_path / "good.safetensors")
    monkeypatch.setattr(ck, "load_tensors", no_memory)
    with pytest.raises(
        UsageError, match=r"^not enough memory to read .*good\.safetensors \(.* on disk, .* available\)"
    ):
        Drafter.load(good, model)


def test_loading_for_another_target_is_refused(model, tmp_path):
    path = Drafter.for_target(model, seed=0).save(tmp_path / "d.safetensors")
    with pytest.raises(UsageError, match=r"trained for embedded, not other.*--model other"):
        Drafter.load(path, tiny_model(0, name="other"))
    with pytest.raises(UsageError, match=r"other weights.*lantern.drafter.train --model embedded"):
        Drafter.load(path, tiny_model(seed=5))  # same name and shapes, different checkpoint
    with pytest.raises(UsageError, match="does not exist"):
        Drafter.load(tmp_path / "nope.safetensors", model)
    with pytest.raises(UsageError, match="no drafter is shipped for nothing-shipped"):
        load_drafter(tiny_model(name="nothing-shipped"))
    assert load_drafter(model, path).target["name"] == "embedded"


# --------------------------------------------------------------------------- token files
@pytest.mark.parametrize("suffix", [".safetensors", ".pt", ".npz"])
def test_token_file_round_trip(tmp_path, suffix):
    tokens = torch.randint(0, 64, (5, N_TOK))
    path = tmp_path / f"t{suffix}"
    if suffix == ".safetensors":
        save_token_file(TokenSet(tokens, [1, 2, 3, 4, 5]), path)
    elif suffix == ".pt":
        torch.save({"tokens": tokens, "labels": torch.tensor([1, 2, 3, 4, 5])}, path)
    else:
        np.savez(path, tokens=tokens.numpy(), labels=np.array([1, 2, 3, 4, 5]))
    ts = load_token_file(path)
    assert torch.equal(ts.tokens, tokens) and ts.conditions == [1, 2, 3, 4, 5]
    train, test = split_holdout(ts, 2, seed=0)
    assert len(train) == 3 and len(test) == 2
    assert sorted(train.conditions + test.conditions) == [1, 2, 3, 4, 5]


def test_token_file_captions_and_conditions_file(tmp_path):
    tokens = torch.randint(0, 64, (2, N_TOK))
    save_token_file(TokenSet(tokens, ["a red car", "a cat"]), tmp_path / "c.safetensors")
    assert load_token_file(tmp_path / "c.safetensors").conditions == ["a red car", "a cat"]
    np.save(tmp_path / "bare.npy", tokens.numpy())
    with pytest.raises(UsageError, match="--conditions FILE"):
        load_token_file(tmp_path / "bare.npy")
    (tmp_path / "c.txt").write_text("3\n7\n")
    assert load_token_file(tmp_path / "bare.npy", tmp_path / "c.txt").conditions == [3, 7]
    with pytest.raises(UsageError, match="unknown suffix"):
        (tmp_path / "x.csv").write_text("1")
        load_token_file(tmp_path / "x.csv")


def test_self_generate_resumes_from_parts(model, tmp_path):
    from ambiguity.sampling import SamplingConfig

    s = SamplingConfig(guidance=2.0, temperature=1.0, top_k=10)
    run = RunDir(tmp_path, {"test": "self-generate"}, command="test").open()
    a = self_generate(model, 6, s, batch_size=4, seed=3, run=run, progress=False)
    assert a.tokens.shape == (6, N_TOK) and a.conditions == [0, 1, 2, 3, 4, 5]
    assert run.part_names() == ["selfgen_00000", "selfgen_00001"]
    run.manifest_path("selfgen_00001").unlink()
    b = self_generate(model, 6, s, batch_size=4, seed=3, run=run, progress=False)
    assert torch.equal(a.tokens, b.tokens)  # part 0 reused, part 1 regenerated from the same image streams
    c = self_generate(model, 6, s, batch_size=6, seed=3, progress=False)
    assert torch.equal(a.tokens, c.tokens)  # each image has its own stream: the batch size does not matter


# --------------------------------------------------------------------------- training run and CLI
def test_train_drafter_learns_and_resumes(model, seqs, tmp_path):
    train, test = seqs.subset(range(32)), seqs.subset(range(32, 40))
    cfg = TrainConfig(epochs=1, batch_size=8, lr=3e-3, warmup_steps=2, seed=0)
    drafter, table = train_drafter(model, train, test, tmp_path, cfg, progress=False)
    assert table["epoch"].tolist() == [0, 1]
    assert table.loc[1, "test_ce"] < table.loc[0, "test_ce"]
    assert (table[["top1", "top2", "top3"]].diff(axis=1).iloc[:, 1:] >= 0).all().all()  # top-1 <= top-2 <= top-3
    assert table.loc[1, "test_positions"] == 8 * (N_TOK - 1)
    assert table.loc[1, "train_rows"] >= 32  # plus the unconditional rows
    assert table.loc[1, "steps"] == math.ceil(table.loc[1, "train_rows"] / 8)
    again = evaluate(drafter, model, sorted((tmp_path / "parts").glob("test_features_*.safetensors")), 8)
    assert again["top1"] == pytest.approx(table.loc[1, "top1"])
    cfg2 = TrainConfig(epochs=2, batch_size=8, lr=3e-3, warmup_steps=2, seed=0)
    _, table2 = train_drafter(model, train, test, tmp_path, cfg2, progress=False)
    assert table2["epoch"].tolist() == [0, 1, 2]
    assert table2.iloc[:2].drop(columns="seconds").equals(table.drop(columns="seconds"))  # resumed, not redone
    with pytest.raises(UsageError, match="other settings"):
        train_drafter(model, train, test, tmp_path, TrainConfig(epochs=2, batch_size=4), progress=False)


def test_cli_trains_saves_and_reports(seqs, tmp_path, capsys):
    from ambiguity.models.vq import VQConfig, VQModel
    from lantern.drafter.train import main

    gpt = tiny_gpt()
    (tmp_path / "w").mkdir()
    vq_cfg = VQConfig(
        codebook_size=64,
        codebook_embed_dim=4,
        encoder_ch_mult=[1, 2],
        decoder_ch_mult=[1, 2],
        z_channels=32,
        ch=32,
        num_res_blocks=1,
        in_channels=1,
    )
    save_module(gpt, gpt.config, tmp_path / "w" / "fashion_gpt.safetensors", dtype=torch.float32)
    save_module(VQModel(vq_cfg), vq_cfg, tmp_path / "w" / "fashion_vq.safetensors")
    save_token_file(seqs, tmp_path / "seqs.safetensors")
    out = tmp_path / "out" / "d.safetensors"
    argv = [
        "--weights",
        str(tmp_path / "w"),
        "--device",
        "cpu",
        "--tokens",
        str(tmp_path / "seqs.safetensors"),
        "--test-size",
        "8",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--run-dir",
        str(tmp_path / "run"),
        "--out",
        str(out),
        "--figure",
        str(tmp_path / "fig.png"),
        "--no-progress",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "top-1 %" in text and "init" in text
    init = next(ln for ln in text.splitlines() if ln.strip().startswith("init"))
    assert "nan" not in init.lower() and " - " in f"{init} "  # no training loss before training: a dash
    import pandas as pd

    table = pd.read_parquet(tmp_path / "out" / "d_accuracy.parquet")
    assert table["epoch"].tolist() == [0, 1]
    assert (tmp_path / "fig.png").stat().st_size > 0 and (tmp_path / "fig.pdf").is_file()
    from ambiguity.models.embedded import load_embedded

    drafter = load_drafter(load_embedded(tmp_path / "w"), out)
    assert drafter.info["epochs_done"] == 1 and drafter.info["data"]["train_sequences"] == 32
    # --classes keeps the sequences of those labels (train and test), recorded with the run
    from lantern.drafter.data import split_holdout

    out3 = tmp_path / "out3" / "d.safetensors"
    cls_argv = [
        *argv[:-7],
        "--run-dir",
        str(tmp_path / "run3"),
        "--out",
        str(out3),
        "--no-progress",
        "--classes",
        "0,1,2,3,4",
    ]
    assert main(cls_argv) == 0
    train, test = split_holdout(seqs, 8, 0)
    kept = [sum(c < 5 for c in ts.conditions) for ts in (train, test)]
    info = load_drafter(load_embedded(tmp_path / "w"), out3).info
    assert info["data"]["train_sequences"] == kept[0] and info["data"]["test_sequences"] == kept[1]
    assert json.loads((tmp_path / "run3" / "run.json").read_text())["settings"]["data"]["classes"] == [0, 1, 2, 3, 4]
    capsys.readouterr()
    assert main([*cls_argv[:-1], "9,10"]) == 2
    assert "class 10 is out of range" in capsys.readouterr().err
    # bad input: one line on stderr, exit code 2
    assert main(argv[:4] + ["--tokens", str(tmp_path / "missing.pt"), "--run-dir", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: token file") and "does not exist" in err[0]


# --------------------------------------------------------------------------- EAGLE data and the stop rule
def test_top1_stalled_hand_values():
    from lantern.drafter.train import top1_stalled

    rows = [{"epoch": e, "top1": t} for e, t in enumerate([0.01, 0.30, 0.35, 0.34, 0.35, 0.36])]
    assert top1_stalled(rows[:3], 1) is None  # 0.35 > 0.30
    assert top1_stalled(rows[:4], 1) == "test top-1 did not rise above 35.00% (epoch 2) for 1 epoch(s)"
    assert top1_stalled(rows[:4], 2) is None  # 0.35 (epoch 2) is within the last 2 epochs
    assert top1_stalled(rows[:5], 2) is not None  # epochs 3, 4: 0.34, 0.35, not above 0.35
    assert top1_stalled(rows, 2) is None and top1_stalled(rows[:5], 0) is None
    assert top1_stalled(rows[:1], 1) is None  # the random init alone


def test_mix_token_sets_shuffles_both_sources(seqs):
    from lantern.drafter.data import mix_token_sets

    a, b = seqs.subset(range(30)), TokenSet(seqs.tokens[30:] + 0, seqs.conditions[30:], "self-generated", {"seed": 1})
    mixed = mix_token_sets([a, b], seed=0)
    assert len(mixed) == 40 and mixed.source == "test+self-generated"
    assert mixed.info["mixed"][1] == {"source": "self-generated", "sequences": 10, "seed": 1}
    key = lambda t, c: (tuple(t.tolist()), c)  # every sequence kept once with its condition
    assert sorted(key(t, c) for t, c in zip(mixed.tokens, mixed.conditions)) == sorted(
        key(t, c) for t, c in zip(seqs.tokens, seqs.conditions)
    )
    assert not torch.equal(mixed.tokens, seqs.tokens)  # shuffled
    with pytest.raises(UsageError, match="lengths"):
        mix_token_sets([a, TokenSet(torch.zeros(2, 4, dtype=torch.long), [0, 1])])


def test_train_drafter_stops_when_top1_stops_rising(model, seqs, tmp_path):
    train, test = seqs.subset(range(32)), seqs.subset(range(32, 40))
    cfg = TrainConfig(epochs=4, batch_size=8, lr=1e-9, warmup_steps=1, seed=0, patience=1)  # top-1 cannot move
    drafter, table = train_drafter(model, train, test, tmp_path, cfg, progress=False)
    assert table["epoch"].tolist() == [0, 1] and table.loc[1, "top1"] == table.loc[0, "top1"]
    assert drafter.info["stop_reason"].startswith("test top-1 did not rise above")
    again, table2 = train_drafter(model, train, test, tmp_path, cfg, progress=False)  # the stopped run stays stopped
    assert table2.drop(columns="seconds").equals(table.drop(columns="seconds"))


def test_cli_self_generate_with_data(seqs, tmp_path, capsys):
    from ambiguity.models.vq import VQConfig, VQModel
    from lantern.drafter.train import main

    gpt = tiny_gpt()
    (tmp_path / "w").mkdir()
    vq_cfg = VQConfig(
        codebook_size=64,
        codebook_embed_dim=4,
        encoder_ch_mult=[1, 2],
        decoder_ch_mult=[1, 2],
        z_channels=32,
        ch=32,
        num_res_blocks=1,
        in_channels=1,
    )
    save_module(gpt, gpt.config, tmp_path / "w" / "fashion_gpt.safetensors", dtype=torch.float32)
    save_module(VQModel(vq_cfg), vq_cfg, tmp_path / "w" / "fashion_vq.safetensors")
    save_token_file(seqs, tmp_path / "seqs.safetensors")
    out = tmp_path / "d.safetensors"
    base = [
        "--weights",
        str(tmp_path / "w"),
        "--device",
        "cpu",
        "--tokens",
        str(tmp_path / "seqs.safetensors"),
        "--test-size",
        "8",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--no-progress",
    ]
    assert (
        main(
            base
            + [
                "--self-generate",
                "6",
                "--with-data",
                "--gen-batch-size",
                "4",
                "--run-dir",
                str(tmp_path / "run"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "stop: epoch budget (1) reached" in capsys.readouterr().out
    from ambiguity.models.embedded import load_embedded

    info = load_drafter(load_embedded(tmp_path / "w"), out).info
    assert info["data"]["train_sequences"] == 32 + 6 and info["data"]["test_sequences"] == 8
    assert info["data"]["train_source"] == str(tmp_path / "seqs.safetensors") + "+self-generated"
    assert main(base + ["--with-data", "--run-dir", str(tmp_path / "r2")]) == 2
    assert "--with-data mixes data tokens into --self-generate N" in capsys.readouterr().err
    assert main(base + ["--self-generate", "6", "--run-dir", str(tmp_path / "r3")]) == 2
    assert "or both with --with-data" in capsys.readouterr().err


def test_weights_digest_reads_embedding_and_head_rows_and_tells_checkpoints_apart(model):
    rows = torch.linspace(0, 63, 16).round().long()  # 16 evenly spaced codes of 64
    h = hashlib.sha256(model.gpt.tok_embeddings.weight[rows].detach().float().numpy().tobytes())
    h.update(model.gpt.output.weight[rows].detach().float().numpy().tobytes())
    assert model.weights_digest() == h.hexdigest()[:16] == model.describe()["weights_digest"]
    assert tiny_model(seed=0).weights_digest() == model.weights_digest()  # same checkpoint, another load
    assert tiny_model(seed=5).weights_digest() != model.weights_digest()


def test_drafter_digest_follows_the_drafter_weights(model):
    from lantern.drafter.model import drafter_digest

    a = Drafter.for_target(model, dtype=torch.float32, seed=1)
    assert drafter_digest(a) == drafter_digest(Drafter.for_target(model, dtype=torch.float32, seed=1))
    assert drafter_digest(a) != drafter_digest(Drafter.for_target(model, dtype=torch.float32, seed=2))
    with torch.no_grad():
        a.fc.bias[0] += 1e-3
    assert drafter_digest(a) != drafter_digest(Drafter.for_target(model, dtype=torch.float32, seed=1))
    assert drafter_digest(None) is None
    h = hashlib.sha256()
    for name, t in sorted(a.state_dict().items()):
        h.update(name.encode())
        h.update(t.float().numpy().tobytes())
    assert drafter_digest(a) == h.hexdigest()[:16]
