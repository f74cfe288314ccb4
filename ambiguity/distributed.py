"""Scale-out: the same commands across processes, GPUs and machines, with identical results.

A run's work is split into *units* by global index (a batch of images for the profiler and the
analyses, an image for lantern's generate, a batch of sequences for drafter self-generation).
Shard ``i`` of ``n`` computes the units ``u`` with ``u % n == i`` and writes them as parts of the
shared run directory (:mod:`ambiguity.runs`). Each image's random stream depends only on
``(seed, global image index)`` (:mod:`ambiguity.seeding`) and every unit is computed exactly as a
single process computes it, so the merged result equals a single-process run row for row, for
any number of shards.

Two ways to launch (:func:`setup_shards`):

* ``torchrun --nproc_per_node=N python -m ...`` (or multi-node torchrun): one process per GPU
  (NCCL on CUDA, gloo on CPU); rank 0 merges the parts once every rank is done.
* independent processes with ``--shard-index i --num-shards n`` (SLURM arrays, machines without a
  shared process group); afterwards ``python -m ambiguity merge RUN`` assembles the outputs.

On the CPU each of the node's processes gets ``cores // processes`` threads (unless
``OMP_NUM_THREADS`` is set), so N processes do not oversubscribe the cores. CPU matrix products
may round differently with another thread count, so a CPU run is identical to a single-process
run with the same threads per process (``OMP_NUM_THREADS``); on GPUs each unit runs the same
kernels whatever the number of processes.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional, TypeVar

import torch
import torch.distributed as dist

from ambiguity.errors import UsageError

__all__ = ["Shard", "SINGLE", "merging_shard", "setup_shards", "torchrun_world", "shard_from_args"]

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """This process's share of a run: shard ``index`` of ``count``.

    group: a torch.distributed process group connects the shards (torchrun); local_rank: the
    process's index on its node (its GPU); merging: a process that only assembles the parts of a
    run computed by ``count`` independent shards (:func:`merging_shard`). merges: whether this
    process writes the run's final outputs (rank 0 under torchrun; the only process of an
    unsharded run; a merging process).
    """

    index: int = 0
    count: int = 1
    group: bool = False
    local_rank: int = 0
    merging: bool = False  # ``python -m ambiguity merge``: computes nothing, assembles every shard's parts

    @property
    def merges(self) -> bool:
        return self.merging or (self.index == 0 and (self.group or self.count == 1))

    @property
    def label(self) -> str:
        return f"shard {self.index + 1}/{self.count}" + (" (torchrun)" if self.group else "")

    def owns(self, unit: int) -> bool:
        """Whether unit ``unit`` (a global index) is this shard's (none for a merging-only shard)."""
        return not self.merging and unit % self.count == self.index

    def barrier(self) -> None:
        """Wait for every shard (a no-op without a process group)."""
        if self.group:
            dist.barrier()

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``tensor`` over the shards of a process group (a copy on the
        tensor's device); ``tensor`` itself without one."""
        if not self.group:
            return tensor
        out = tensor.to(torch.device("cuda", self.local_rank) if dist.get_backend() == "nccl" else "cpu").clone()
        dist.all_reduce(out)
        return out.to(tensor.device)

    def first(self, fn: Callable[[], T], then: Optional[Callable[[], T]] = None) -> T:
        """Run ``fn`` on shard 0 first, then (after a barrier) ``then`` (default ``fn``) on the others:
        e.g. create or clear the run directory before anyone writes into it."""
        if self.index == 0:
            out = fn()
            self.barrier()
            return out
        self.barrier()
        return (then or fn)()

    def device(self, device: torch.device) -> torch.device:
        """The process's own GPU under torchrun (``cuda:<local rank>``); ``device`` otherwise."""
        if self.group and device.type == "cuda":
            return torch.device("cuda", self.local_rank)
        return device


SINGLE = Shard()


def merging_shard(count: int) -> Shard:
    """The shard of ``python -m ambiguity merge`` for a run of ``count`` independent shards: it
    owns no unit and merges (a missing part is then refused, not computed)."""
    return Shard(0, int(count), False, 0, merging=True)


def torchrun_world() -> Optional[tuple[int, int, int, int]]:
    """(rank, world size, local rank, local world size) when launched by torchrun with more than
    one process, else None."""
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env or int(env["WORLD_SIZE"]) < 2:
        return None
    return (
        int(env["RANK"]),
        int(env["WORLD_SIZE"]),
        int(env.get("LOCAL_RANK", 0)),
        int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
    )


def setup_shards(
    shard_index: Optional[int] = None, num_shards: Optional[int] = None, device: Optional[torch.device] = None
) -> Shard:
    """This process's :class:`Shard`: torchrun's rank and world size (the process group is
    initialised: NCCL for CUDA ``device``, gloo otherwise; CPU threads shared out), or
    ``--shard-index/--num-shards``, or the single shard of a plain run.

    Raises UsageError for ``--shard-index`` without ``--num-shards`` (or the reverse), an index
    out of range, or shard options under torchrun.
    """
    world = torchrun_world()
    if world is not None:
        if shard_index is not None or num_shards is not None:
            raise UsageError(
                "--shard-index/--num-shards are for independent processes; under torchrun every "
                "process is a shard already: drop them"
            )
        rank, size, local, local_size = world
        cuda = device is not None and device.type == "cuda"
        if cuda:
            torch.cuda.set_device(local)
        elif "OMP_NUM_THREADS" not in os.environ:  # an explicit thread count wins
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_size))
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(hours=6))
        return Shard(rank, size, True, local)
    if shard_index is None and num_shards is None:
        return SINGLE
    if shard_index is None or num_shards is None:
        raise UsageError("give --shard-index and --num-shards together (shard i of n, i in 0..n-1)")
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise UsageError(
            f"--shard-index must be in 0..{num_shards - 1} for --num-shards {num_shards}, got {shard_index}"
        )
    return Shard(shard_index, num_shards, False, 0)


def shard_from_args(args, device: Optional[torch.device] = None) -> Shard:
    """:func:`setup_shards` from parsed ``--shard-index/--num-shards``; refuses ``--overwrite`` on a
    shard of several (one shard must not clear the parts of the others)."""
    shard = setup_shards(getattr(args, "shard_index", None), getattr(args, "num_shards", None), device)
    if shard.count > 1 and not shard.group and getattr(args, "overwrite", False):
        raise UsageError(
            "--overwrite with --num-shards would clear other shards' parts; use a new --out, or "
            "clear the run once without --num-shards"
        )
    return shard
