"""Neighbourhood concentration and latent interchangeability on cases whose answers are known."""

import math

import pandas as pd
import pytest
import torch

from ambiguity.analyses import concentration as conc
from ambiguity.analyses import interchangeability as inter
from ambiguity.errors import UsageError
from ambiguity.neighbourhood import build_neighbourhoods
from ambiguity.runs import RunOptions

# A codebook on a line: code i sits at i. l2 neighbours of code 3 are 2, 4, 1, 5, 0, 6, 7 (ties -> lower index).
LINE = torch.arange(8, dtype=torch.float32)[:, None]


@pytest.fixture(scope="module")
def line_table():
    return build_neighbourhoods(LINE, 7, "l2", cache=False)


def test_line_table_is_what_the_hand_says(line_table):
    assert line_table.indices[3].tolist() == [2, 4, 1, 5, 0, 6, 7]


def test_mass_all_on_the_neighbours_of_the_top1(line_table):
    p = torch.tensor([[0.0, 0.1, 0.2, 0.4, 0.2, 0.1, 0.0, 0.0]])
    a = torch.tensor([3])
    ks = [1, 2, 4, 7]
    assert conc.neighbourhood_mass(p, a, line_table.indices, ks)[0].tolist() == pytest.approx([0.2, 0.4, 0.6, 0.6])
    assert conc.top_mass(p, a, ks)[0].tolist() == pytest.approx([0.2, 0.4, 0.6, 0.6])
    assert conc.expected_random_mass(p, a, ks)[0].tolist() == pytest.approx([0.6 / 7, 1.2 / 7, 2.4 / 7, 0.6])


def test_mass_far_from_the_top1(line_table):
    # the runner-up tokens are the farthest codes: latent neighbours catch nothing until k = 5
    p = torch.tensor([[0.2, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.3]])
    a = torch.tensor([3])
    ks = [1, 2, 4, 5, 6, 7]
    assert conc.neighbourhood_mass(p, a, line_table.indices, ks)[0].tolist() == pytest.approx([0, 0, 0, 0.2, 0.2, 0.5])
    assert conc.top_mass(p, a, ks)[0].tolist() == pytest.approx([0.3, 0.5, 0.5, 0.5, 0.5, 0.5])


def test_sampled_random_mass_matches_its_expectation():
    g = torch.Generator().manual_seed(0)
    V, P = 256, 4000
    e = -(torch.rand(P, V, generator=g).log() ** 3)  # heavy-tailed weights, seeded
    p = e / e.sum(1, keepdim=True)
    a = p.argmax(1)
    rand = build_neighbourhoods(torch.randn(V, 4, generator=g), V - 1, "random", seed=1, cache=False)
    ks = [4, 32, 128, V - 1]
    got = conc.neighbourhood_mass(p, a, rand.indices, ks).mean(0)
    want = conc.expected_random_mass(p, a, ks).mean(0)
    torch.testing.assert_close(got, want, rtol=0.08, atol=1e-6)  # seeded; ~4 s.e. at k = 4
    assert got[-1].item() == pytest.approx(want[-1].item(), abs=1e-6)


def test_default_ks_and_summary():
    assert conc.default_ks(64) == [1, 2, 4, 8, 16, 32, 63]
    assert conc.default_ks(3) == [1, 2]
    pos = pd.DataFrame(
        {
            "set": ["random"] * 4 + ["neighbours:l2"] * 4,
            "k": [1, 1, 2, 2] * 2,
            "mass": [0.1, 0.3, 0.2, 0.4, 0.4, 0.4, 0.6, 0.6],
        }
    )
    s = conc.summarize_concentration(pos).set_index(["set", "k"])
    assert s.loc[("neighbours:l2", 1), "mean"] == pytest.approx(0.4)
    assert s.loc[("neighbours:l2", 1), "over_random"] == pytest.approx(2.0)
    assert s.loc[("random", 2), "q50"] == pytest.approx(0.3)
    assert s.loc[("random", 2), "positions"] == 2


# --------------------------------------------------------------------------- tiny LlamaGen model
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ambiguity.models.checkpoints import save_module
    from ambiguity.models.embedded import load_embedded
    from ambiguity.models.gpt import GPT, GPTConfig
    from ambiguity.models.vq import VQConfig, VQModel

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny")
    gc = GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=64, block_size=16, num_classes=10, multiple_of=32)
    vc = VQConfig(
        codebook_size=64,
        codebook_embed_dim=4,
        encoder_ch_mult=[1, 2],
        decoder_ch_mult=[1, 2],
        z_channels=32,
        ch=32,
        num_res_blocks=1,
        in_channels=1,
    )
    gpt = GPT(gc)
    with torch.no_grad():
        gpt.output.weight.normal_()  # the LlamaGen init zeroes the head: make p non-uniform
    save_module(gpt, gc, d / "fashion_gpt.safetensors", dtype=torch.float32)
    save_module(VQModel(vc), vc, d / "fashion_vq.safetensors", dtype=torch.float32)
    return d, load_embedded(weights=d)


def test_concentration_on_a_model_invariants_and_resume(tiny, tmp_path, monkeypatch):
    _, model = tiny
    ks = [1, 4, 16, 63]
    opts = RunOptions(out=tmp_path, progress=False)
    kw = dict(num_images=3, batch_size=2, seed=3, cache_dir=tmp_path / "c", options=opts)
    pos, summary = conc.run_concentration(model, ks, ["l2", "cosine"], **kw)
    assert len(pos) == 3 * 16 * 5 * len(ks)  # images x positions x sets x ks
    wide = pos.pivot_table(index=["image", "position", "k"], columns="set", values="mass")
    eps = 1e-6
    for s in ("neighbours:l2", "neighbours:cosine", "random"):
        assert (wide[s] <= wide["top-k"] + eps).all()
    last = pos[pos["k"] == 63]
    assert ((last["mass"] - (1 - last["anchor_p"])).abs() < 1e-5).all()
    steps = pos.sort_values("k").groupby(["image", "position", "set"])["mass"].diff().dropna()
    assert (steps >= -eps).all()  # masses grow with k
    assert set(summary["set"]) == {"neighbours:l2", "neighbours:cosine", "random", "random-expected", "top-k"}
    # resume: a rerun with the same settings reads the parts and samples nothing
    import ambiguity.generation as gen

    def boom(*a, **k):
        raise AssertionError("resumed run sampled again")

    monkeypatch.setattr(gen, "sample_tokens", boom)
    pos2, _ = conc.run_concentration(model, ks, ["l2", "cosine"], **kw)
    pd.testing.assert_frame_equal(pos, pos2)


def test_concentration_teacher_forced_real_tokens(tiny, tmp_path):
    _, model = tiny
    g = torch.Generator().manual_seed(0)
    images = torch.rand(3, 1, 8, 8, generator=g)
    pos, summary = conc.run_concentration(
        model,
        [2, 63],
        num_images=3,
        batch_size=2,
        anchor="sampled",
        conditions=[1, 2, 3],
        images=images,
        cache_dir=tmp_path,
        options=RunOptions(progress=False),
    )
    real = model.encode_images(images).reshape(3, 16)
    one = pos[(pos["set"] == "top-k") & (pos["k"] == 2)].sort_values(["image", "position"])
    assert one["anchor"].tolist() == real.reshape(-1).tolist()  # anchors are the real tokens
    assert one["condition"].tolist() == [str(c) for c in (1, 2, 3) for _ in range(16)]
    last = pos[pos["k"] == 63]
    assert ((last["mass"] - (1 - last["anchor_p"])).abs() < 1e-5).all()


def test_real_images_need_a_matching_model(tiny):
    from ambiguity.analyses.common import analysis_inputs

    with pytest.raises(UsageError, match=r"takes \(1, 8, 8\) images, not Fashion-MNIST"):
        analysis_inputs(tiny[1], 2, 0, data="fashion-mnist")


def test_concentration_bad_inputs(tiny):
    _, model = tiny
    with pytest.raises(UsageError, match=r"--ks must lie in 1\.\.63"):
        conc.run_concentration(model, [0, 4], num_images=1, cache_dir=None, options=RunOptions(progress=False))
    with pytest.raises(UsageError, match="--metrics"):
        conc.run_concentration(model, [4], ["random"], num_images=1, options=RunOptions(progress=False))


# --------------------------------------------------------------------------- interchangeability
class LinearDecoder:
    """Decodes a code grid (B, h, w) to images (B, d, h, w) = codebook rows: linear in the codebook."""

    name = "linear"
    can_decode = True

    def __init__(self, codebook):
        self.E = codebook
        self.vocab_size = codebook.shape[0]
        self.image_token_ids = torch.arange(self.vocab_size)

    def decode_codes(self, codes):
        return self.E[codes].permute(0, 3, 1, 2)


def test_replacement_error_by_hand():
    E = torch.tensor([[0.0], [1.0], [3.0], [7.0]])  # nearest other: 0->1, 1->0, 2->1, 3->2
    model = LinearDecoder(E)
    nb = build_neighbourhoods(E, 1, cache=False)
    codes = torch.tensor([[[0, 1], [2, 3]]])
    df = inter.interchangeability(model, codes, nb, E, [1], [1.0], seed=0)
    row = df[df["mode"] == "neighbour"].iloc[0]
    assert row["mse"] == pytest.approx((1 + 1 + 4 + 16) / 4)
    assert row["psnr"] == pytest.approx(10 * math.log10(1 / 5.5))
    assert row["latent_distance"] == pytest.approx((1 + 1 + 2 + 4) / 4)
    assert row["replaced"] == 4
    # half the tokens of a grid of code 3: two swaps to code 2, each costing 16 -> MSE 32 / 4
    df = inter.interchangeability(model, torch.full((5, 2, 2), 3), nb, E, [1], [0.5], seed=1)
    assert (df[df["mode"] == "neighbour"]["mse"] == 8.0).all()


def test_random_replacement_by_hand_and_uniform():
    E = torch.tensor([[0.0], [2.0]])
    model = LinearDecoder(E)
    nb = build_neighbourhoods(E, 1, cache=False)
    df = inter.interchangeability(model, torch.zeros(2, 3, 3, dtype=torch.long), nb, E, [1], [1.0], seed=0)
    assert (df[df["mode"] == "random"]["mse"] == 4.0).all()  # the only other code is 2 away
    g = torch.Generator().manual_seed(0)
    codes = torch.full((300, 100), 2)
    new, mask = inter.replace_tokens(codes, 1.0, g, vocab_size=4)
    assert mask.all() and not (new == 2).any()
    freq = torch.bincount(new.view(-1), minlength=4).float() / new.numel()
    torch.testing.assert_close(freq, torch.tensor([1 / 3, 1 / 3, 0.0, 1 / 3]), atol=0.01, rtol=0)  # 30k draws


def test_replace_tokens_counts_and_membership():
    g = torch.Generator().manual_seed(0)
    table = build_neighbourhoods(torch.randn(32, 3, generator=g), 8, cache=False)
    codes = torch.randint(32, (6, 4, 5), generator=g)
    for rate, m in ((0.0, 0), (0.25, 5), (0.3, 6), (1.0, 20)):
        new, mask = inter.replace_tokens(codes, rate, g, neighbours=table.indices, k=3)
        assert (mask.view(6, -1).sum(1) == m).all()
        assert torch.equal(new[~mask], codes[~mask])
        allowed = table.indices[codes[mask], :3]
        assert ((allowed == new[mask][:, None]).any(1)).all()
    with pytest.raises(UsageError, match="k must be in 1..8"):
        inter.replace_tokens(codes, 0.5, g, neighbours=table.indices, k=9)
    with pytest.raises(UsageError, match=r"\[0, 1\]"):
        inter.replace_tokens(codes, 1.5, g, neighbours=table.indices, k=1)


def test_interchangeability_on_a_model_resume_and_grid(tiny, tmp_path, monkeypatch):
    _, model = tiny
    kw = dict(num_images=2, batch_size=2, cache_dir=tmp_path / "c", options=RunOptions(out=tmp_path, progress=False))
    codes, nb, per_image, summary = inter.run_interchangeability(model, [1, 4], [0.5, 1.0], **kw)
    assert codes.shape == (2, 4, 4) and nb.k == 4
    assert len(summary) == 2 * 2 + 2 and len(per_image) == 6 * 2
    assert (per_image["replaced"] == per_image["rate"] * 16).all()
    assert summary["k"].isna().sum() == 2
    # the image grid shows the table's first draw: its k=4, r=1 row has the table's error
    images, labels = inter.replacement_rows(model, codes, nb, 4, [0.5, 1.0], show=2)
    assert labels == ["original", "B_4, r=0.5", "B_4, r=1", "random, r=0.5", "random, r=1"]
    assert images.shape == (5 * 2, 1, 8, 8)
    mse, _ = inter.pixel_errors(images[4:6], images[0:2])
    got = per_image[(per_image["k"] == 4) & (per_image["rate"] == 1.0)]["mse"].to_numpy()
    assert got.tolist() == pytest.approx(mse.tolist(), rel=1e-5)
    assert inter.replacement_grid(model, codes, nb, 4, [1.0], show=2) is not None
    calls = []
    monkeypatch.setattr(inter, "_decode", lambda *a, **k: calls.append(1))
    _, _, again, _ = inter.run_interchangeability(model, [1, 4], [0.5, 1.0], **kw)
    assert calls == [1] and again.equals(per_image)  # only the reference decode; parts reused


@pytest.mark.slow
def test_clis_write_outputs_and_fail_in_one_line(tiny, tmp_path, capsys):
    from ambiguity.analyses.__main__ import main

    d, _ = tiny
    common = [
        "--weights",
        str(d),
        "--device",
        "cpu",
        "--num-images",
        "2",
        "--batch-size",
        "2",
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    assert main(["concentration", *common, "--ks", "1,8,63", "--out", str(tmp_path / "a")]) == 0
    s = pd.read_parquet(tmp_path / "a" / "concentration.parquet")
    assert set(s["k"]) == {1, 8, 63} and (tmp_path / "a" / "concentration.png").is_file()
    assert main(["interchangeability", *common, "--ks", "2", "--rates", "0.5", "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "interchangeability_grid.pdf").is_file()
    assert "latent interchangeability" in capsys.readouterr().out
    assert main(["interchangeability", *common, "--rates", "2", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --rates values must lie in [0.0, 1.0]") and "\n" not in err
    assert main(["nonsense"]) == 2


def test_analyses_without_an_analysis_exits_2(capsys):
    from ambiguity.analyses.__main__ import main

    assert main([]) == 2
    assert capsys.readouterr().err.strip().startswith("error: name a command: concentration, interchangeability")


def test_no_progress_silences_the_neighbourhood_bar(tmp_path, monkeypatch, capsys):
    """``--no-progress`` reaches the k-NN build (its bar shows by default from 8192 codes, as for
    embedded-16's 16384), in the analyses and in lantern.generate."""
    import ambiguity.neighbourhood as nbm
    from lantern import generate

    rows = torch.randn(8192, 4, generator=torch.Generator().manual_seed(0))
    nbm.build_neighbourhoods(rows, 2, "l2", cache_dir=tmp_path / "a", progress=False)
    assert "neighbourhoods" not in capsys.readouterr().err
    nbm.build_neighbourhoods(rows, 2, "l2", cache_dir=tmp_path / "b")  # the default for a large codebook
    assert "neighbourhoods (l2, k=2)" in capsys.readouterr().err
    monkeypatch.setenv("AMBIGUITY_NEIGHBOURHOOD_CACHE", str(tmp_path / "nb-cache"))
    seen = []
    real = nbm.build_neighbourhoods

    def spy(*args, **kwargs):
        seen.append(kwargs.get("progress"))
        return real(*args, **kwargs)

    for mod in (conc, inter, nbm):
        monkeypatch.setattr(mod, "build_neighbourhoods", spy)
    common = ["--num-images", "1", "--batch-size", "1", "--no-progress", "--cache-dir", str(tmp_path / "c")]
    assert conc.main([*common, "--ks", "1,4", "--out", str(tmp_path / "conc")]) == 0
    assert inter.main([*common, "--ks", "4", "--rates", "0.5", "--out", str(tmp_path / "inter")]) == 0
    assert (
        generate.main(
            ["--method", "lantern", "--k", "4", "--num-images", "1", "--no-progress", "--out", str(tmp_path / "gen")]
        )
        == 0
    )
    assert seen and all(p is False for p in seen), seen
