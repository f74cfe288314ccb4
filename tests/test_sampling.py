"""The top-k / top-p filters and the k-th largest value they read (hand-computed cases)."""

import pytest
import torch

from ambiguity.sampling import SamplingConfig, distribution, filter_logits, kth_largest


def test_kth_largest_by_hand_with_ties_and_minus_infinity():
    x = torch.tensor([[3.0, 1.0, 3.0, -float("inf"), 2.0], [0.5, 0.5, 0.5, 0.5, 0.5]])
    assert kth_largest(x, 1).flatten().tolist() == [3.0, 0.5]
    assert kth_largest(x, 2).flatten().tolist() == [3.0, 0.5]  # the tie counts twice
    assert kth_largest(x, 3).flatten().tolist() == [2.0, 0.5]
    assert kth_largest(x, 5).flatten().tolist() == [-float("inf"), 0.5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_kth_largest_equals_torch_kthvalue(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 4, 257, generator=g) * 2).round(decimals=1).to(dtype)  # many ties
    x[..., ::7] = -float("inf")
    for k in (1, 2, 36, 100, 257):
        want = torch.kthvalue(x.float(), 257 - k + 1, dim=-1, keepdim=True).values
        got = kth_largest(x, k)
        assert got.shape == (3, 4, 1) and got.dtype == dtype
        assert torch.equal(got.float(), want)
    strided = x.transpose(0, 1)  # a non-contiguous view
    assert torch.equal(kth_largest(strided, 9).float(), torch.kthvalue(strided.float(), 249, -1, True).values)


def test_top_k_keeps_ties_and_top_p_by_hand():
    x = torch.tensor([[2.0, 1.0, 2.0, 0.0]])
    assert filter_logits(x, top_k=1).tolist() == [[2.0, -float("inf"), 2.0, -float("inf")]]
    p = distribution(x, SamplingConfig(guidance=1.0, temperature=1.0, top_k=3))
    e = torch.exp(torch.tensor([2.0, 1.0, 2.0]))
    assert torch.allclose(p, torch.tensor([[e[0], e[1], e[2], 0.0]]) / e.sum())
    # top-p 0.5 over softmax([2, 1, 2, 0]) = [0.42, 0.16, 0.42, 0.06]: the first token already covers 0.42 < 0.5,
    # the second (the other 2.0) reaches 0.84 and is kept; the rest go
    kept = filter_logits(x, top_p=0.5)
    assert torch.isfinite(kept).tolist() == [[True, False, True, False]]


def test_reuse_freed_blocks_on_glibc():
    """On glibc (every Linux this runs on) the thresholds are raised once and the answer is kept."""
    import ctypes
    import platform

    from ambiguity import allocator

    if platform.system() != "Linux" or not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"):
        pytest.skip("glibc only")
    assert allocator.reuse_freed_blocks() is True
    assert allocator._done == [True] and allocator.reuse_freed_blocks() is True
