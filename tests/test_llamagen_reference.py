"""The in-project LlamaGen matches the official implementation on ../shared/reference fixtures."""

import json

import pytest
import torch
from safetensors.torch import load_file

from ambiguity.generation import sample_tokens
from ambiguity.models.checkpoints import load_checkpoint_state, load_strict
from ambiguity.models.gpt import GPT, gpt_config_from_official
from ambiguity.models.llamagen import LlamaGenModel, official_gpt_config
from ambiguity.models.vq import VQModel, vq_config_from_official
from ambiguity.sampling import SamplingConfig


@pytest.fixture(scope="module")
def ref(reference_dir):
    d = reference_dir / "llamagen"
    return d, json.loads((d / "cases.json").read_text()), load_file(str(d / "expected.safetensors"))


def _gpt(ref, case):
    d, cases, _ = ref
    gpt = GPT(gpt_config_from_official(cases[case]["model_args"]))
    load_strict(gpt, load_checkpoint_state(d / f"{case}.pt"), case)
    return gpt.eval()


@pytest.mark.parametrize("case", ["gpt_tiny_c2i", "gpt_tiny_t2i"])
def test_teacher_forced_logits_match_official(ref, case):
    _, _, exp = ref
    gpt = _gpt(ref, case)
    with torch.no_grad():
        logits = gpt.teacher_forced_logits(exp[f"{case}.cond"], exp[f"{case}.idx"])
    torch.testing.assert_close(logits, exp[f"{case}.teacher_forced_logits"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["gpt_tiny_c2i", "gpt_tiny_t2i"])
def test_adapter_teacher_force_matches_official(ref, case):
    _, _, exp = ref
    model = LlamaGenModel(_gpt(ref, case))
    prompt = model.make_prompt(exp[f"{case}.cond"] if case.endswith("t2i") else exp[f"{case}.cond"].tolist())
    with torch.no_grad():
        step = model.teacher_force(prompt, exp[f"{case}.idx"])
    torch.testing.assert_close(step.logits, exp[f"{case}.teacher_forced_logits"], atol=1e-5, rtol=0)
    assert step.hidden.shape == (3, 16, 64)


@pytest.mark.parametrize("case", ["gpt_tiny_c2i", "gpt_tiny_t2i"])
@pytest.mark.parametrize("scale", [1, 3])
def test_greedy_tokens_with_kv_cache_match_official(ref, case, scale):
    _, _, exp = ref
    model = LlamaGenModel(_gpt(ref, case))
    sampling = SamplingConfig(guidance=float(scale), temperature=0.0)
    cond = exp[f"{case}.cond"]
    prompt = model.make_prompt(cond if case.endswith("t2i") else cond.tolist(), guided=sampling.guided)
    tokens = sample_tokens(model, prompt, sampling)
    assert torch.equal(tokens, exp[f"{case}.greedy_tokens_cfg{scale}"].long())


def test_vq_codes_and_decoding_match_official(ref):
    d, cases, exp = ref
    vq = VQModel(vq_config_from_official(cases["vq_tiny"]["model_args"], ch=cases["vq_tiny"]["encoder_decoder_ch"]))
    load_strict(vq, load_checkpoint_state(d / "vq_tiny.pt"), "vq_tiny.pt")
    vq.eval()
    with torch.no_grad():
        codes = vq.encode(exp["vq_tiny.image"])
        assert torch.equal(codes, exp["vq_tiny.codes"])
        torch.testing.assert_close(vq.quantize.lookup(codes), exp["vq_tiny.quant"], atol=1e-5, rtol=0)
        torch.testing.assert_close(vq.decode_codes(exp["vq_tiny.codes"]), exp["vq_tiny.decoded"], atol=1e-5, rtol=0)


def test_adapter_pixels_use_unit_range(ref):
    d, cases, exp = ref
    vq = VQModel(vq_config_from_official(cases["vq_tiny"]["model_args"], ch=cases["vq_tiny"]["encoder_decoder_ch"]))
    load_strict(vq, load_checkpoint_state(d / "vq_tiny.pt"), "vq_tiny.pt")
    model = LlamaGenModel(_gpt(ref, "gpt_tiny_c2i"), vq)
    images01 = (exp["vq_tiny.image"] + 1) / 2
    assert torch.equal(model.encode_images(images01), exp["vq_tiny.codes"])
    torch.testing.assert_close(
        model.decode_codes(exp["vq_tiny.codes"]), ((exp["vq_tiny.decoded"] + 1) / 2).clamp(0, 1), atol=1e-5, rtol=0
    )


MANIFEST_MODELS = {
    "GPT-XL_t2i_256": ("GPT-XL", "t2i", 256),
    "GPT-XL_t2i_512": ("GPT-XL", "t2i", 512),
    "GPT-B_c2i_256": ("GPT-B", "c2i", 256),
    "GPT-XL_c2i_384": ("GPT-XL", "c2i", 384),
}


@pytest.mark.parametrize("key", sorted(MANIFEST_MODELS))
def test_real_size_gpt_configs_have_official_keys_and_shapes(reference_dir, key):
    manifest = json.loads((reference_dir / "llamagen" / "state_dict_manifest.json").read_text())[key]
    preset, kind, res = MANIFEST_MODELS[key]
    with torch.device("meta"):
        gpt = GPT(official_gpt_config(preset, kind, res))
    shapes = {k: list(v.shape) for k, v in gpt.state_dict().items()}
    assert shapes == manifest


def test_real_size_vq16_has_official_keys_and_shapes(reference_dir):
    from ambiguity.models.llamagen import VQ16

    manifest = json.loads((reference_dir / "llamagen" / "state_dict_manifest.json").read_text())["VQ-16"]
    with torch.device("meta"):
        vq = VQModel(vq_config_from_official(VQ16))
    assert {k: list(v.shape) for k, v in vq.state_dict().items()} == manifest
