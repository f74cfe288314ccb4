"""Loading official LlamaGen checkpoints by registry name: layouts, strict keys, stage checks,
the local Hugging Face cache, and one-line errors for absent or mismatched weights."""

import json
import shutil

import pytest
import torch
from hf_tiny import save_to_hf_cache, use_hf_cache

import ambiguity.models.llamagen as lg
from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.models.checkpoints import load_checkpoint_state
from ambiguity.models.gpt import gpt_config_from_official
from ambiguity.models.llamagen import check_checkpoint_name
from ambiguity.models.registry import load_model


@pytest.fixture()
def tiny_official(reference_dir, monkeypatch):
    """Make the registry build the tiny reference architectures instead of the real-size ones."""
    d = reference_dir / "llamagen"
    cases = json.loads((d / "cases.json").read_text())
    monkeypatch.setattr(
        lg,
        "official_gpt_config",
        lambda preset, kind, res, downsample=16: gpt_config_from_official(cases[f"gpt_tiny_{kind}"]["model_args"]),
    )
    monkeypatch.setattr(lg, "VQ16", dict(cases["vq_tiny"]["model_args"], ch=cases["vq_tiny"]["encoder_decoder_ch"]))
    return d


@pytest.mark.parametrize("layout", ["model", "module", "state_dict", "bare"])
def test_checkpoint_layouts(reference_dir, tmp_path, layout):
    state = torch.load(reference_dir / "llamagen" / "gpt_tiny_c2i.pt", weights_only=True)["model"]
    path = tmp_path / "ckpt.pt"
    torch.save(state if layout == "bare" else {layout: state}, path)
    loaded = load_checkpoint_state(path)
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)


def test_registry_loads_official_files_from_a_directory(tiny_official, tmp_path):
    shutil.copy(tiny_official / "gpt_tiny_c2i.pt", tmp_path / "c2i_B_256.pt")
    shutil.copy(tiny_official / "vq_tiny.pt", tmp_path / "vq_ds16_c2i.pt")
    model = load_model("llamagen-c2i-b", weights=tmp_path, device="cpu")
    assert model.kind == "c2i" and model.vocab_size == 64 and model.grid == (4, 4) and model.can_decode
    assert model.decode_codes(torch.zeros(1, 8, 8, dtype=torch.long)).shape == (1, 3, 16, 16)


def test_registry_finds_weights_in_the_hf_cache(tiny_official, tmp_path, monkeypatch):
    src = tmp_path / "files"
    src.mkdir()
    shutil.copy(tiny_official / "gpt_tiny_c2i.pt", src / "c2i_L_256.pt")
    save_to_hf_cache(tmp_path / "hub", "FoundationVision/LlamaGen", src)
    use_hf_cache(monkeypatch, tmp_path / "hub")
    model = load_model("llamagen-c2i-l", device="cpu")
    assert model.vq is None and not model.can_decode  # the GPT loads; pixels need the VQ file


def test_absent_weights_name_the_file_to_download(tmp_path, monkeypatch):
    use_hf_cache(monkeypatch, tmp_path / "empty-hub")
    with pytest.raises(WeightsNotFoundError, match=r"hf download peizesun/llamagen_t2i t2i_XL_stage1_256.pt"):
        load_model("llamagen-t2i-stage1")
    with pytest.raises(WeightsNotFoundError, match="holds no c2i_B_256.pt"):
        load_model("llamagen-c2i-b", weights=tmp_path)


def test_stage_two_checkpoint_is_refused_by_the_stage_one_model(tmp_path):
    wrong = tmp_path / "t2i_XL_stage2_512.pt"
    wrong.write_bytes(b"not read: the name check comes first")
    with pytest.raises(
        UsageError,
        match="Stage 2 checkpoint but --model llamagen-t2i-stage1 is Stage 1; use --model llamagen-t2i-stage2",
    ):
        load_model("llamagen-t2i-stage1", weights=wrong)


def test_resolution_in_the_file_name_must_match():
    with pytest.raises(UsageError, match="384 px checkpoint"):
        check_checkpoint_name("c2i_L_384.pt", "llamagen-c2i-l", None, 256)
    check_checkpoint_name("c2i_L_256.pt", "llamagen-c2i-l", None, 256)
    check_checkpoint_name("my_finetune.pt", "llamagen-t2i-stage1", 1, 256)  # unknown names are trusted


def test_mismatched_checkpoint_is_one_line_error(tiny_official, tmp_path):
    shutil.copy(tiny_official / "gpt_tiny_t2i.pt", tmp_path / "c2i_B_256.pt")  # t2i keys into a c2i model
    with pytest.raises(UsageError) as err:
        load_model("llamagen-c2i-b", weights=tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "does not match the model architecture" in msg and "missing" in msg


def test_unreadable_checkpoint_is_one_line_error(tmp_path):
    bad = tmp_path / "c2i_B_256.pt"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(UsageError, match="as a PyTorch checkpoint .*check that --weights"):
        load_model("llamagen-c2i-b", weights=bad)
