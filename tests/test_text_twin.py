"""The embedded text twin: corpus parsing, BPE tokenizer, passages, the model adapter, quick training."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from reference.cache import OneImageCache

from ambiguity.data import text_corpus as tc
from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.io import load_tensors
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.text_twin import TextTwinModel, load_heldout, load_text_twin, twin_config
from ambiguity.sampling import SamplingConfig, distribution

ROOT = Path(__file__).resolve().parents[1]
IMAGE = GPTConfig(
    dim=32, n_layer=2, n_head=2, vocab_size=300, block_size=16, num_classes=10, multiple_of=32, class_dropout_prob=0.1
)


@pytest.fixture(scope="module")
def tokenizer():
    train, _ = tc.split_chapters(tc.synthetic_corpus())
    return tc.train_tokenizer(train, 300)


@pytest.fixture(scope="module")
def twin(tokenizer):
    torch.manual_seed(0)
    gpt = GPT(twin_config(IMAGE))
    for p in gpt.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    return TextTwinModel(gpt.eval(), tokenizer)


def load_script():
    spec = importlib.util.spec_from_file_location("train_text_twin", ROOT / "scripts" / "train_text_twin.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the script loads
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------- corpus
BIBLE_OUTPUT = """
Genesis 1

  1 In the beginning God created the heaven and the earth.
  2 And the earth was without form, and void.

1 Samuel 3

  1 And the child Samuel ministered unto the LORD before Eli.
"""


def test_parse_bible_output_keeps_headings_and_verses():
    chapters = tc.parse_bible_output(BIBLE_OUTPUT)
    assert [c.name for c in chapters] == ["Genesis 1", "1 Samuel 3"]
    assert chapters[0].verses == [
        "In the beginning God created the heaven and the earth.",
        "And the earth was without form, and void.",
    ]
    assert chapters[1].verses == ["And the child Samuel ministered unto the LORD before Eli."]


def test_read_text_file_paragraphs_are_chapters(tmp_path):
    f = tmp_path / "prose.txt"
    f.write_text("First line.\nSecond line.\n\n\nThird line.\n")
    chapters = tc.read_text_file(f)
    assert [c.verses for c in chapters] == [["First line.", "Second line."], ["Third line."]]
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(UsageError, match="no text"):
        tc.read_text_file(tmp_path / "empty.txt")
    with pytest.raises(UsageError, match="does not exist"):
        tc.read_text_file(tmp_path / "missing.txt")


def test_split_every_tenth_chapter_is_held_out():
    chapters = [tc.Chapter(str(i), ["x"]) for i in range(25)]
    train, test = tc.split_chapters(chapters, 10)
    assert [c.name for c in test] == ["9", "19"]
    assert len(train) == 23
    with pytest.raises(UsageError):
        tc.split_chapters(chapters[:5], 10)


def test_tokenizer_has_exact_size_is_deterministic_and_lossless(tokenizer):
    assert tokenizer.get_vocab_size() == 300
    train, _ = tc.split_chapters(tc.synthetic_corpus())
    again = tc.train_tokenizer(train, 300)
    assert again.get_vocab() == tokenizer.get_vocab()
    text = " The king went up to the city, 12 times; naïve café."
    assert tokenizer.decode(tokenizer.encode(text).ids) == text  # byte level: nothing is unknown
    with pytest.raises(UsageError, match="vocab_size > 256"):
        tc.train_tokenizer(train, 256)
    with pytest.raises(UsageError, match="larger --corpus"):
        tc.train_tokenizer([tc.Chapter("a", ["ab ab"])], 400)


def test_encode_chapters_marks_verse_starts(tokenizer):
    chapters = tc.synthetic_corpus(n_chapters=2, verses_per_chapter=3)
    ids, starts = tc.encode_chapters(tokenizer, chapters)
    verses = [v for c in chapters for v in c.verses]
    assert starts.tolist()[0] == 0 and len(starts) == 6
    bounds = starts.tolist() + [ids.numel()]
    for i, v in enumerate(verses):
        assert tokenizer.decode(ids[bounds[i] : bounds[i + 1]].tolist()) == " " + v


def test_passages_and_disjoint_starts_exact():
    ids = torch.arange(10)
    starts = torch.tensor([0, 2, 5, 7, 9])
    assert tc.passages(ids, starts, 3).tolist() == [[0, 1, 2], [2, 3, 4], [5, 6, 7], [7, 8, 9]]
    assert tc.passages(ids, starts, 3, stride=2).tolist() == [[0, 1, 2], [5, 6, 7]]
    assert tc.disjoint_starts(starts, 3).tolist() == [0, 5, 9]
    assert tc.passages(ids, starts, 11).shape == (0, 11)


# --------------------------------------------------------------------------- model
def test_twin_config_matches_the_image_model():
    cfg = twin_config(IMAGE, length=64)
    for k in ("dim", "n_layer", "n_head", "vocab_size", "multiple_of", "ffn_dim", "norm_eps", "rope_base"):
        assert getattr(cfg, k) == getattr(IMAGE, k)
    assert (cfg.model_type, cfg.num_classes, cfg.class_dropout_prob, cfg.rope, cfg.block_size) == (
        "c2i",
        1,
        0.0,
        "1d",
        64,
    )
    assert twin_config(IMAGE).block_size == 16


def test_adapter_facts_and_prompt_tokens(twin, tokenizer):
    assert (twin.kind, twin.grid, twin.vocab_size, twin.num_classes) == ("text", (1, 16), 300, None)
    p = twin.make_prompt(["The king", ""])
    ids = tokenizer.encode(" The king").ids
    assert p.inputs["ids"][0, -len(ids) :].tolist() == ids
    assert p.inputs["mask"][1].tolist() == [False] * len(ids) + [True]  # BOS only, left-padded
    assert twin.make_prompt(["", ""]).inputs["mask"] is None
    assert twin.make_prompt(torch.zeros(3, dtype=torch.long)).batch_size == 3
    assert twin.default_conditions(2) == ["", ""]


def test_prompt_errors(twin):
    with pytest.raises(UsageError, match="shorten"):
        twin.make_prompt([" the" * 40])
    with pytest.raises(UsageError, match="strings"):
        twin.make_prompt([1.5])
    with pytest.raises(UsageError, match="BOS"):
        twin.make_prompt(torch.tensor([1, 0]))
    with pytest.raises(UsageError, match="at least one"):
        twin.make_prompt([])


@torch.no_grad()
def test_left_padding_changes_nothing(twin):
    texts = ["The king went up to", "", "a"]
    batch = twin.make_prompt(texts)
    first = OneImageCache(twin, batch, 4).prefill()
    x = torch.randint(0, 300, (3, 5), generator=torch.Generator().manual_seed(1))
    forced = twin.teacher_force(batch, x)
    for i, t in enumerate(texts):
        one = twin.make_prompt([t])
        ref = OneImageCache(twin, one, 4).prefill()
        torch.testing.assert_close(first.logits[i], ref.logits[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(forced.logits[i], twin.teacher_force(one, x[i : i + 1]).logits[0], atol=1e-5, rtol=0)


@torch.no_grad()
def test_teacher_force_equals_cached_decoding(twin):
    p = twin.make_prompt(["", "The river"])
    x = torch.randint(0, 300, (2, 6), generator=torch.Generator().manual_seed(2))
    forced = twin.teacher_force(p, x).logits
    cache = OneImageCache(twin, p, 6)
    steps = [cache.prefill().logits]
    for t in range(5):
        steps.append(cache.extend(x[:, t : t + 1]).logits)
    torch.testing.assert_close(forced, torch.cat(steps, 1), atol=1e-5, rtol=0)
    for i in range(2):  # each row alone, unpadded: one full forward
        alone = twin.teacher_force(twin.make_prompt([["", "The river"][i]]), x[i : i + 1]).logits
        torch.testing.assert_close(forced[i : i + 1], alone, atol=1e-5, rtol=0)


@torch.no_grad()
def test_guidance_with_bos_prompts_is_the_identity(twin):
    p = twin.make_prompt(["", ""], guided=True)
    logits = OneImageCache(twin, p, 1).prefill().logits[:, -1]
    guided = distribution(logits, SamplingConfig(guidance=3.0))
    plain = distribution(logits[:2], SamplingConfig())
    torch.testing.assert_close(guided, plain, atol=1e-6, rtol=0)
    q = twin.make_prompt(["The king", ""], guided=True)
    assert q.rows == 4 and q.inputs["mask"][2:, :-1].any().item() is False  # unconditional rows: BOS only


def test_missing_weights_name_the_training_command(tmp_path):
    with pytest.raises(WeightsNotFoundError, match="train_text_twin.py"):
        load_text_twin(weights=tmp_path)
    with pytest.raises(UsageError, match="held-out"):
        load_heldout(tmp_path)


# --------------------------------------------------------------------------- training end to end
@pytest.mark.slow  # ~5 s on an idle 2-core machine (three runs of the script, torch's optimizer import)
def test_quick_training_then_load_and_generate(tmp_path, capsys):
    from ambiguity.generation import sample_tokens
    from ambiguity.models.registry import load_model

    script = load_script()
    out = tmp_path / "w"
    argv = ["--quick", "--out", str(out), "--run-dir", str(tmp_path / "run"), "--no-progress"]
    assert script.main(argv) == 0
    assert "held-out NLL" in capsys.readouterr().out
    metrics = json.loads((out / "text_twin_metrics.json").read_text())
    assert metrics["config"]["vocab_size"] == 300 and metrics["config"]["rope"] == "1d"
    assert metrics["token_budget"] == metrics["steps"] * metrics["batch_size"] * 64 == 8 * 8 * 64
    assert (
        0 < metrics["test"]["nll_bits_per_token"] < 9 and metrics["test"]["tokens"] == 64 * metrics["passages_heldout"]
    )

    model = load_model("text-twin", weights=out, device="cpu")
    assert isinstance(model, TextTwinModel) and model.tokenizer.get_vocab_size() == 300
    tokens = sample_tokens(
        model, model.make_prompt(["", "The king"]), SamplingConfig(), torch.Generator().manual_seed(0)
    )
    assert tokens.shape == (2, 64) and int(tokens.max()) < 300
    assert all(isinstance(s, str) for s in model.decode(tokens))
    held, conds = model.dataset_sequences(4, seed=0)
    assert held.shape == (4, 64) and conds == [""] * 4
    assert load_heldout(out).shape[1] == 64

    # the profile of a text model writes its passages, detokenised, instead of an image grid
    from ambiguity.profile import main as profile_main

    prof = tmp_path / "profile"
    assert (
        profile_main(
            ["--model", "text-twin", "--weights", str(out), "--num-images", "2", "--out", str(prof), "--no-progress"]
        )
        == 0
    )
    assert "samples.txt" in capsys.readouterr().out
    samples = (prof / "samples.txt").read_text()
    assert samples.count("--- passage ") == 2 and not (prof / "images.png").exists()

    # rerunning the same command resumes from the final checkpoint: same weights, no new steps
    before = load_tensors(out / "text_twin.safetensors")
    assert script.main(argv) == 0
    after = load_tensors(out / "text_twin.safetensors")
    assert after[1] == before[1] and all(torch.equal(after[0][k], v) for k, v in before[0].items())
    # other settings into the same run dir: one line, exit 2
    assert script.main(argv + ["--token-budget", "9999"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fresh" in err[0]


def test_twin_reuses_llamagen_decoding_through_the_prefix_hooks():
    """No copy of LlamaGen's prefix cache / teacher forcing: only the two prefix hooks differ."""
    from ambiguity.models.llamagen import LlamaGenModel
    from ambiguity.models.text_twin import TextTwinModel

    for name in ("prefix_cache", "teacher_force"):
        assert name not in TextTwinModel.__dict__ and name in LlamaGenModel.__dict__
    assert {"prefix_length", "prefix_embeddings"} <= set(TextTwinModel.__dict__)
