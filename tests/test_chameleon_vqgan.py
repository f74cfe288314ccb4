"""The in-project Chameleon VQGAN matches the official architecture (tests/fixtures/reference/chameleon_vqgan)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from ambiguity.errors import UsageError
from ambiguity.models.chameleon_vqgan import (
    ChameleonVQGAN,
    VQGANConfig,
    load_vqgan,
    read_vqgan_config,
    vqgan_config_from_hf,
    vqgan_from_state,
)
from ambiguity.models.checkpoints import load_checkpoint_state


@pytest.fixture(scope="module")
def ref(reference_dir):
    d = reference_dir / "chameleon_vqgan"
    return d, load_file(str(d / "expected.safetensors"))


def test_codes_and_decoding_match_official(ref):
    d, exp = ref
    vq = load_vqgan(d / "vqgan_tiny.ckpt")  # config.json (official argument names) next to the checkpoint
    assert vq.config == VQGANConfig(
        ch=32,
        ch_mult=(1, 2),
        num_res_blocks=1,
        attn_resolutions=(8,),
        resolution=16,
        z_channels=32,
        n_embed=32,
        embed_dim=8,
    )
    with torch.no_grad():
        codes = vq.encode(exp["image"])
        assert codes.dtype == torch.int64 and torch.equal(codes, exp["codes"])
        torch.testing.assert_close(vq.quantize.lookup(exp["codes"]), exp["quant"], atol=1e-5, rtol=0)
        torch.testing.assert_close(vq.decode_codes(exp["codes"]), exp["decoded"], atol=1e-5, rtol=0)


def test_real_config_has_exactly_the_released_keys_and_shapes(ref):
    d, _ = ref
    manifest = json.loads((d / "state_dict_manifest_8192x256.json").read_text())
    with torch.device("meta"):
        vq = ChameleonVQGAN(VQGANConfig())
    assert {k: list(v.shape) for k, v in vq.state_dict().items()} == manifest
    assert VQGANConfig().grid == 32 and VQGANConfig().downsample == 16


def test_vqgan_yaml_is_read_like_the_release(ref, tmp_path):
    d, exp = ref
    shutil.copy(d / "vqgan_tiny.ckpt", tmp_path / "vqgan.ckpt")
    (tmp_path / "vqgan.yaml").write_text(
        "model:\n  target: taming.models.vqgan.VQModel\n  params:\n    embed_dim: 8\n    n_embed: 32\n"
        "    ddconfig:\n      double_z: false\n      z_channels: 32\n      resolution: 16\n      in_channels: 3\n"
        "      out_ch: 3\n      ch: 32\n      ch_mult: [1, 2]\n      num_res_blocks: 1\n      attn_resolutions: [8]\n"
        "      dropout: 0.0\n    lossconfig:\n      target: taming.modules.losses.DummyLoss\n"
    )
    assert read_vqgan_config(tmp_path / "vqgan.yaml") == read_vqgan_config(d / "config.json")
    vq = load_vqgan(tmp_path / "vqgan.ckpt")
    with torch.no_grad():
        assert torch.equal(vq.encode(exp["image"]), exp["codes"])


def test_strict_loading_drops_only_gan_loss_keys(ref, tmp_path):
    d, _ = ref
    state = load_checkpoint_state(d / "vqgan_tiny.ckpt")
    cfg = read_vqgan_config(d / "config.json")
    vqgan_from_state({**state, "loss.discriminator.main.0.weight": torch.zeros(1)}, cfg)
    with pytest.raises(UsageError, match="unexpected 1 keys") as err:
        vqgan_from_state({**state, "decoder.extra.weight": torch.zeros(1)}, cfg)
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="missing 1 keys"):
        vqgan_from_state({k: v for k, v in state.items() if k != "decoder.conv_out.bias"}, cfg)
    with pytest.raises(UsageError, match="shape mismatch"):
        vqgan_from_state(state, VQGANConfig(**{**cfg.__dict__, "n_embed": 16}))
    shutil.copy(d / "vqgan_tiny.ckpt", tmp_path / "vqgan.ckpt")
    with pytest.raises(UsageError, match="no vqgan.yaml"):
        load_vqgan(tmp_path / "vqgan.ckpt")


def test_transformers_encoder_reads_the_same_weights(ref):
    """transformers' ChameleonVQVAE (the encoder half inside every HF Chameleon checkpoint) uses the
    official names too, so its weights can be shared with this VQGAN."""
    from transformers import ChameleonVQVAEConfig
    from transformers.models.chameleon.modeling_chameleon import ChameleonVQVAE

    d, exp = ref
    hf_cfg = ChameleonVQVAEConfig(
        embed_dim=8,
        num_embeddings=32,
        latent_channels=32,
        resolution=16,
        base_channels=32,
        channel_multiplier=[1, 2],
        num_res_blocks=1,
        attn_resolutions=[8],
    )
    assert vqgan_config_from_hf(hf_cfg) == read_vqgan_config(d / "config.json")
    hf = ChameleonVQVAE(hf_cfg).eval()
    state = load_checkpoint_state(d / "vqgan_tiny.ckpt")
    hf.load_state_dict({k: v for k, v in state.items() if not k.startswith("decoder.")}, strict=True)
    with torch.no_grad():
        assert torch.equal(hf.encode(exp["image"]).image_tokens.view(2, 8, 8), exp["codes"])


def test_decode_codes_rejects_codes_outside_the_codebook(ref):
    d, _ = ref
    vq = load_vqgan(d / "vqgan_tiny.ckpt")
    with pytest.raises(UsageError, match="0..31"):
        vq.decode_codes(torch.full((1, 2, 2), 32))
    with pytest.raises(UsageError, match="batch, height, width"):
        vq.decode_codes(torch.zeros(4, dtype=torch.long))
    with torch.no_grad():  # fully convolutional: a 3 x 5 grid decodes to 6 x 10 px
        assert vq.decode_codes(torch.zeros(1, 3, 5, dtype=torch.long)).shape == (1, 3, 6, 10)
