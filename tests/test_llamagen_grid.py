"""The token grid of a LlamaGen checkpoint (issue item 2): its state dict does not record it, so a
Stage II file (512 px, 32 x 32) under another name loaded into the Stage I model at 16 x 16 without a
word. The size is declared (``--image-size``), read (the file name, a config stored in the file) or
assumed from the model name with a ``note:``; disagreeing sources are refused."""

import json
import warnings

import pytest
import torch

import ambiguity.models.llamagen as lg
from ambiguity.errors import UsageError
from ambiguity.models.gpt import gpt_config_from_official
from ambiguity.models.llamagen import llamagen_image_size
from ambiguity.models.registry import check_image_size, load_model

NOTE = (
    "llamagen-t2i-stage1: finetune.pt does not record its image size; assuming 256 px (16 x 16 tokens) from "
    "the model name; pass --image-size if it was trained at another size"
)


def test_the_size_is_declared_read_or_assumed_with_a_note():
    assert llamagen_image_size("finetune.pt", "llamagen-t2i-stage1", 256, stage=1) == (256, NOTE)
    assert llamagen_image_size("finetune.pt", "llamagen-t2i-stage1", 256, declared=512, stage=1) == (512, None)
    assert llamagen_image_size("finetune.pt", "llamagen-t2i-stage1", 256, stored=512, stage=1) == (512, None)
    assert llamagen_image_size("t2i_XL_stage2_512.pt", "llamagen-t2i-stage2", 512, stage=2) == (512, None)
    assert llamagen_image_size("c2i_L_384.pt", "llamagen-c2i-l-384", 384) == (384, None)
    assert llamagen_image_size("t2i_stage2.pt", "llamagen-t2i-stage2", 512, stage=2) == (512, None)  # the stage


@pytest.mark.parametrize(
    "path, declared, stored, expect",
    [
        ("t2i_XL_stage2_512.pt", 256, None, "--image-size 256 says 256 px but the file name t2i_XL_stage2_512.pt"),
        ("finetune.pt", 256, 512, "--image-size 256 says 256 px but the image_size 512 stored in finetune.pt"),
        ("ft_384.pt", None, 256, "the image_size 256 stored in ft_384.pt says 256 px but the file name ft_384.pt"),
        ("finetune.pt", 500, None, "--image-size must be a positive multiple of 16"),
    ],
)
def test_disagreeing_sizes_are_refused(path, declared, stored, expect):
    with pytest.raises(UsageError) as err:
        llamagen_image_size(path, "llamagen-t2i-stage1", 256, declared, stored, stage=1)
    assert str(err.value).startswith(expect) and "\n" not in str(err.value)


def test_image_size_is_refused_for_models_that_know_their_grid():
    with pytest.raises(UsageError, match="embedded knows its own, drop --image-size"):
        check_image_size("embedded", 64)
    check_image_size("llamagen-t2i-stage1", 512)
    check_image_size("embedded", None)


@pytest.fixture()
def sized_official(reference_dir, monkeypatch):
    """The registry builds the tiny reference t2i architecture with the grid of the size it is given."""
    d = reference_dir / "llamagen"
    args = json.loads((d / "cases.json").read_text())["gpt_tiny_t2i"]["model_args"]
    monkeypatch.setattr(
        lg,
        "official_gpt_config",
        lambda preset, kind, res, downsample=16: gpt_config_from_official(args, block_size=(res // 16) ** 2),
    )
    return torch.load(d / "gpt_tiny_t2i.pt", weights_only=True)["model"]


def test_a_stage_two_file_under_another_name_gets_a_note_or_its_declared_grid(sized_official, tmp_path):
    path = tmp_path / "finetune.pt"
    torch.save({"model": sized_official}, path)
    with pytest.warns(UserWarning) as notes:
        assumed = load_model("llamagen-t2i-stage1", weights=path, device="cpu")
    assert [str(w.message) for w in notes] == [NOTE]
    assert assumed.grid == (16, 16) and assumed.describe()["image_size_from"] == "assumed"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no note when declared
        declared = load_model("llamagen-t2i-stage1", weights=path, device="cpu", image_size=512)
    facts = declared.describe()
    assert declared.grid == (32, 32) and facts["grid"] == [32, 32] and declared.num_tokens == 1024
    assert facts["image_size_from"] == "declared (--image-size)"


def test_a_size_stored_in_the_file_sets_the_grid_and_must_agree(sized_official, tmp_path):
    path = tmp_path / "finetune.pt"
    torch.save({"model": sized_official, "args": {"image_size": 512}}, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = load_model("llamagen-t2i-stage1", weights=path, device="cpu")
    assert model.grid == (32, 32) and model.describe()["image_size_from"] == "read"
    with pytest.raises(UsageError, match="--image-size 256 says 256 px but the image_size 512 stored in finetune.pt"):
        load_model("llamagen-t2i-stage1", weights=path, device="cpu", image_size=256)


def test_a_declared_size_against_the_file_name_is_refused_before_reading(tmp_path):
    wrong = tmp_path / "t2i_XL_stage2_512.pt"
    wrong.write_bytes(b"not read: the name check comes first")
    with pytest.raises(UsageError, match="--image-size 256 says 256 px but the file name t2i_XL_stage2_512.pt"):
        load_model("llamagen-t2i-stage2", weights=wrong, image_size=256)
