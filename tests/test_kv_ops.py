"""ambiguity.models.kv_ops.move_cache_entries: the indexed copy behind KVCache.move and SlotKV.move."""

import torch

from ambiguity.models.kv_ops import move_cache_entries


def test_move_cache_entries_reads_every_entry_before_writing_in_every_leading_dim():
    """Entry value = 10 * row + position (heads, head_dim and a leading layer dim alike): row 0 moves
    2 -> 0 and 0 -> 1 (position 0 is read before it is overwritten), row 1 swaps 1 and 3, a pair with
    src == dst keeps its entry."""
    rows, L = 2, 4
    base = (10 * torch.arange(rows)[:, None] + torch.arange(L)[None]).double()  # (rows, L)
    buf = base[None, :, None, :, None].expand(3, rows, 2, L, 5).clone()  # (layers, rows, heads, L, head_dim)
    move_cache_entries(buf, torch.tensor([[2, 0, 3], [1, 3, 2]]), torch.tensor([[0, 1, 3], [3, 1, 2]]))
    want = torch.tensor([[2.0, 0.0, 2.0, 3.0], [10.0, 13.0, 12.0, 11.0]])
    assert torch.equal(buf, want[None, :, None, :, None].expand_as(buf))
    one = base[:, None, :, None].expand(rows, 2, L, 5).clone()  # a single layer (SlotKV's layout)
    move_cache_entries(one, torch.tensor([[2, 0, 3], [1, 3, 2]]), torch.tensor([[0, 1, 3], [3, 1, 2]]))
    assert torch.equal(one, want[:, None, :, None].expand_as(one))
