"""Latent neighbourhoods B_k: exactness against brute force, ties, self exclusion, cache, ids, CLI."""

import pytest
import torch

import ambiguity.knn as knn
import ambiguity.neighbourhood as nbm
from ambiguity.errors import UsageError
from ambiguity.knn import exact_knn
from ambiguity.neighbourhood import Neighbourhoods, build_neighbourhoods, load_neighbourhoods

EXACT = ("l2", "l2-normalized", "cosine")
BACKENDS = ("faiss", "torch")


def brute_force(x: torch.Tensor, metric: str):
    """Float64 reference: all N-1 others of every row by (distance, index)."""
    x = x.double()
    if metric in ("l2-normalized", "cosine"):
        x = torch.nn.functional.normalize(x, dim=1)
    d = 1 - x @ x.T if metric == "cosine" else torch.cdist(x, x)
    d.fill_diagonal_(float("inf"))
    v, i = torch.sort(d, dim=1, stable=True)
    return i[:, :-1], v[:, :-1]


@pytest.mark.parametrize("metric", EXACT)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [7, 119])
def test_matches_brute_force(metric, backend, k):
    x = torch.randn(120, 6, generator=torch.Generator().manual_seed(1)) * 3
    I, D = exact_knn(x, k, metric, backend=backend)
    ri, rd = brute_force(x, metric)
    assert I.shape == (120, k) and I.dtype == torch.int64 and D.dtype == torch.float32
    torch.testing.assert_close(D.double(), rd[:, :k], atol=2e-5, rtol=1e-5)
    # indices agree wherever the reference distance is not within float32 noise of a neighbour's
    r = torch.cat([rd, torch.full((120, 1), float("inf"), dtype=rd.dtype)], 1)
    gap_next = (r[:, 1:] - r[:, :-1]).abs()
    gap_prev = torch.cat([torch.full((120, 1), float("inf"), dtype=rd.dtype), gap_next[:, :-1]], 1)
    near = (torch.minimum(gap_prev, gap_next) < 1e-5)[:, :k]
    assert bool(((I == ri[:, :k]) | near).all())
    assert (I != ri[:, :k]).sum() <= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicates_self_excluded_and_ties_by_index(backend):
    x = torch.tensor([[0.0], [0.0], [0.0], [0.0], [1.0], [1.0], [1.0], [1.0], [3.0], [3.0]])
    I, D = exact_knn(x, 5, "l2", backend=backend)
    assert I[0].tolist() == [1, 2, 3, 4, 5] and D[0].tolist() == [0, 0, 0, 1, 1]
    assert I[3].tolist() == [0, 1, 2, 4, 5]
    assert I[5].tolist() == [4, 6, 7, 0, 1] and D[5].tolist() == [0, 0, 0, 1, 1]
    assert I[8].tolist() == [9, 4, 5, 6, 7] and D[8].tolist() == [0, 2, 2, 2, 2]
    assert I[9].tolist() == [8, 4, 5, 6, 7]
    I3, _ = exact_knn(x, 3, "l2", backend=backend)
    assert I3[2].tolist() == [0, 1, 3]  # the three duplicates, never itself
    assert bool((I != torch.arange(10)[:, None]).all())


@pytest.mark.parametrize("metric", EXACT)
def test_k_is_n_minus_1_ascending_permutation_of_others(metric):
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(2))
    I, D = exact_knn(x, 39, metric)
    others = [sorted(set(range(40)) - {i}) for i in range(40)]
    assert [sorted(r) for r in I.tolist()] == others
    assert bool((D[:, 1:] >= D[:, :-1]).all())
    ties = D[:, 1:] == D[:, :-1]
    assert bool((I[:, 1:] > I[:, :-1])[ties].all())


def test_faiss_and_torch_backends_agree():
    x = torch.randn(300, 8, generator=torch.Generator().manual_seed(3))
    a, da = exact_knn(x, 50, "l2", backend="faiss")
    b, db = exact_knn(x, 50, "l2", backend="torch", block_bytes=16 * 300 * 7)  # blocks of 7 rows
    assert (a != b).float().mean() < 0.002
    torch.testing.assert_close(da, db, atol=1e-5, rtol=1e-5)


def test_auto_backend_falls_back_to_torch_without_faiss(monkeypatch):
    """A machine whose Python lacks faiss (e.g. a GPU image) still builds neighbourhoods: "auto"
    takes the torch sort there, with the same neighbours as faiss; an explicit "faiss" fails."""
    import sys

    x = torch.randn(120, 6, generator=torch.Generator().manual_seed(5))
    want, dwant = exact_knn(x, 20, "l2", backend="faiss")
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError
    got, dgot = exact_knn(x, 20, "l2")
    assert torch.equal(got, want)
    torch.testing.assert_close(dgot, dwant, atol=1e-5, rtol=1e-5)
    with pytest.raises(ImportError):
        exact_knn(x, 20, "l2", backend="faiss")


def test_random_control_is_seeded_prefix_consistent_and_not_sorted():
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(4))
    I, D = exact_knn(x, 299, "random", seed=7)
    assert [sorted(r) for r in I.tolist()] == [sorted(set(range(300)) - {i}) for i in range(300)]
    torch.testing.assert_close(D, torch.cdist(x, x).gather(1, I), atol=1e-5, rtol=1e-5)
    I10, _ = exact_knn(x, 10, "random", seed=7)
    assert torch.equal(I10, I[:, :10])
    assert not torch.equal(exact_knn(x, 10, "random", seed=8)[0], I10)
    assert (D[:, 1:] >= D[:, :-1]).all(1).sum() == 0  # no row is distance-sorted
    # first neighbour uniform over the 299 others: a chi-square-like check on 300 rows is weak, so
    # check the mean rank of the first random neighbour in the true l2 order (uniform: 150 +- 5 s.e.)
    ri, _ = brute_force(x, "l2")
    rank = (ri == I[:, :1]).float().argmax(1).float()
    assert abs(rank.mean().item() - 149.0) < 20


@pytest.mark.parametrize("bad_k", [0, -1, 10, 11, 2.5, "3"])
def test_bad_k_is_a_usage_error(bad_k):
    with pytest.raises(UsageError, match=r"k must be an integer in 1\.\.9") as e:
        exact_knn(torch.randn(10, 2), bad_k)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_matrix_is_a_usage_error(value):
    x = torch.randn(10, 2)
    x[4, 1] = value
    with pytest.raises(UsageError, match=r"NaN or Inf in 1 rows \(e\.g\. \[4\]\)"):
        build_neighbourhoods(x, 3, cache=False)


def test_other_bad_inputs():
    with pytest.raises(UsageError, match="unknown metric"):
        exact_knn(torch.randn(10, 2), 3, "manhattan")
    with pytest.raises(UsageError, match="2-D"):
        exact_knn(torch.randn(10), 3)
    with pytest.raises(UsageError, match="image_token_ids has 3 entries"):
        build_neighbourhoods(torch.randn(10, 2), 3, image_token_ids=torch.arange(3), cache=False)


def test_cache_hit_reuse_and_invalidation(tmp_path, monkeypatch):
    calls = []
    real = nbm.exact_knn

    def counting(*a, **kw):
        calls.append(a[1])
        return real(*a, **kw)

    monkeypatch.setattr(nbm, "exact_knn", counting)
    x = torch.randn(64, 5, generator=torch.Generator().manual_seed(5))
    first = build_neighbourhoods(x, 20, "l2", cache_dir=tmp_path)
    again = build_neighbourhoods(x.clone(), 20, "l2", cache_dir=tmp_path)
    assert calls == [20] and again.from_cache and not first.from_cache
    assert torch.equal(first.indices, again.indices) and torch.equal(first.distances, again.distances)
    smaller = build_neighbourhoods(x, 5, "l2", cache_dir=tmp_path)  # prefix of the k = 20 table
    assert calls == [20] and torch.equal(smaller.indices, first.indices[:, :5])
    build_neighbourhoods(x, 5, "cosine", cache_dir=tmp_path)  # other metric: other key
    assert calls == [20, 5]
    y = x.clone()
    y[17, 2] += 1e-3  # one entry of one row changes
    changed = build_neighbourhoods(y, 20, "l2", cache_dir=tmp_path)
    assert calls == [20, 5, 20] and not changed.from_cache and changed.key != first.key
    build_neighbourhoods(x, 20, "l2", cache_dir=tmp_path, cache=False)
    assert calls == [20, 5, 20, 20]
    monkeypatch.setenv("AMBIGUITY_NEIGHBOURHOOD_CACHE", str(tmp_path))
    assert nbm.default_cache_dir() == tmp_path
    assert build_neighbourhoods(x, 20, "l2").from_cache


def test_damaged_cache_file_is_rebuilt(tmp_path):
    x = torch.randn(32, 3, generator=torch.Generator().manual_seed(6))
    a = build_neighbourhoods(x, 4, cache_dir=tmp_path)
    (f,) = tmp_path.glob("*.safetensors")
    f.write_bytes(b"not a safetensors file")
    with pytest.warns(UserWarning, match="unreadable neighbourhood cache"):
        b = build_neighbourhoods(x, 4, cache_dir=tmp_path)
    assert torch.equal(a.indices, b.indices) and not b.from_cache


class ChameleonLike:
    """Duck-typed model: image tokens are vocabulary ids 4 + a permutation of the codes."""

    name = "chameleon-like"

    def __init__(self, n=16):
        g = torch.Generator().manual_seed(9)
        self.rows = torch.randn(n, 3, generator=g)
        self.image_token_ids = 4 + torch.randperm(n, generator=g)

    def codebook(self):
        return self.rows

    def input_embeddings(self):
        raise NotImplementedError("chameleon-like keeps no input embeddings")

    def output_embeddings(self):
        return self.rows * 2


def test_vocabulary_ids_of_a_chameleon_style_model(tmp_path):
    model = ChameleonLike()
    nb = nbm.model_neighbourhoods(model, 5, "l2", cache_dir=tmp_path)
    ids = model.image_token_ids
    assert nb.source == "chameleon-like:codebook"
    assert torch.equal(nb.vocab_ids(), ids[nb.indices])
    assert int(nb.vocab_ids().min()) >= 4
    # look-up by vocabulary id: neighbours of the token whose id is ids[c] are ids[B_k(c)]
    for c in (0, 7, 15):
        assert torch.equal(nb.of_vocab(ids[c]), ids[nb.indices[c]])
    assert nb.of_vocab(ids[torch.tensor([[1, 2]])]).shape == (1, 2, 5)
    with pytest.raises(UsageError, match="not image tokens"):
        nb.of_vocab(torch.tensor([2]))  # a text-token id
    frame = nb.to_frame()
    ids_np = ids.numpy()
    assert len(frame) == 16 * 5 and (frame["neighbour_vocab_id"] == ids_np[frame["neighbour"]]).all()
    assert (frame["vocab_id"] == ids_np[frame["code"]]).all()
    nb.save(tmp_path / "t.safetensors")
    back = load_neighbourhoods(tmp_path / "t.safetensors")
    assert torch.equal(back.indices, nb.indices) and torch.equal(back.image_token_ids, ids)
    with pytest.raises(UsageError, match="choose --matrix codebook or codebook-raw or output"):
        nbm.model_neighbourhoods(model, 5, "l2", matrix="input", cache_dir=tmp_path)


def test_truncate_and_summary():
    x = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
    nb = build_neighbourhoods(x, 3, cache=False)
    assert nb.indices.tolist() == [[1, 2, 3], [0, 2, 3], [1, 0, 3], [2, 1, 0]]
    t = nb.truncate(1)
    assert t.k == 1 and t.distances[:, 0].tolist() == [1, 1, 2, 4]
    assert nb.summary()["mean_d1"] == 2.0
    with pytest.raises(UsageError):
        nb.truncate(4)
    assert isinstance(t, Neighbourhoods)


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    from ambiguity.models.checkpoints import save_module
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
    save_module(GPT(gc), gc, d / "fashion_gpt.safetensors", dtype=torch.float32)
    save_module(VQModel(vc), vc, d / "fashion_vq.safetensors", dtype=torch.float32)
    return d


def test_cli_writes_table_and_errors_in_one_line(tiny_weights, tmp_path, capsys):
    import pandas as pd

    out = tmp_path / "nb.parquet"
    rc = nbm.main(
        [
            "--weights",
            str(tiny_weights),
            "--k",
            "8",
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "c"),
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    df = pd.read_parquet(out)
    assert len(df) == 64 * 8 and list(df.columns) == [
        "code",
        "vocab_id",
        "rank",
        "neighbour",
        "neighbour_vocab_id",
        "distance",
    ]
    assert f"wrote {out}" in capsys.readouterr().out
    rc = nbm.main(["--weights", str(tiny_weights), "--k", "64", "--out", str(out), "--no-cache", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: --k must be an integer in 1..63") and "\n" not in err
    rc = nbm.main(
        [
            "--weights",
            str(tiny_weights),
            "--k",
            "all",
            "--out",
            str(tmp_path / "all.safetensors"),
            "--no-cache",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0 and load_neighbourhoods(tmp_path / "all.safetensors").k == 63


def _drop_self_resorting(D, I, rows, k):
    """The previous builder's self removal, kept as the reference: sort every row by (distance, index)."""
    o = torch.argsort(I, dim=1, stable=True)
    D, I = D.gather(1, o), I.gather(1, o)
    o = torch.argsort(D, dim=1, stable=True)
    D, I = D.gather(1, o), I.gather(1, o)
    keep = I != rows[:, None]
    keep[~(~keep).any(1), -1] = False
    return D[keep].view(-1, k), I[keep].view(-1, k)


def _tied_codebook():
    """600 x 3 integer codes in {0, 1, 2}^3 (27 distinct points: every row has ~21 exact duplicates
    and every distance is one of 7 values), so nearly every neighbour list is decided by ties."""
    return torch.randint(0, 3, (600, 3), generator=torch.Generator().manual_seed(5)).float()


@pytest.mark.parametrize("metric", EXACT)
@pytest.mark.parametrize("k", [1, 20, 21, 22, 300, 599])
def test_drop_self_without_resort_gives_the_same_table_on_ties(metric, k):
    x = knn._prepare(_tied_codebook(), metric)
    rows = torch.arange(600)
    scores, cand = knn.faiss_search(x, x.numpy(), k + 1, metric, False)
    D = knn.to_distance(scores, metric)
    want = _drop_self_resorting(D, cand, rows, k)
    got = knn.drop_self(D, cand, rows, k)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    # the same on candidates handed over in a scrambled order (every row takes the re-sort path)
    perm = torch.rand(600, k + 1, generator=torch.Generator().manual_seed(6)).argsort(1)
    got = knn.drop_self(D.gather(1, perm), cand.gather(1, perm), rows, k)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    # and the builder's table equals the float64 brute force ordering by (distance, index)
    I, _ = exact_knn(_tied_codebook(), k, metric)
    ri, _ = brute_force(_tied_codebook(), metric)
    assert torch.equal(I, ri[:, :k]) if metric == "l2" else bool((I != rows[:, None]).all())


def test_drop_self_removes_self_wherever_it_sits_or_the_last_candidate():
    D = torch.tensor([[0.0, 0.0, 1.0, 2.0], [0.0, 1.0, 1.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    I = torch.tensor([[4, 0, 7, 2], [5, 6, 1, 9], [3, 4, 5, 6]])
    rows = torch.tensor([0, 9, 2])
    d, i = knn.drop_self(D, I, rows, 3)
    # row 0: reordered to (0,0)(0,4)(1,7)(2,2), self 0 removed; row 1: self last; row 2: self absent, last dropped
    assert i.tolist() == [[4, 7, 2], [5, 1, 6], [3, 4, 5]]
    assert d.tolist() == [[0.0, 1.0, 2.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
