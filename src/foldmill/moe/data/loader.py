"""Batches of fixed-length windows over a packed corpus split, in a reproducible, resumable order.

A split's stream is cut into windows of seq_len + 1 tokens (input and shifted target) with stride
seq_len, never across shard files. A window holds several records (and parts of records);
`document_ids` tells them apart so that attention stays within each. Each epoch visits all
windows in a permutation drawn from (seed, epoch); process `rank` of `world_size` takes every
world_size-th window. The sampler's state (epoch, position) is saved in checkpoints, so a resumed
run sees exactly the batches it would have.
Step s of all processes together takes windows [s * B * W, (s + 1) * B * W) of the epoch's
permutation (B per process, W processes), so a run resumed with another W and the same B * W
continues with the same global batches.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from foldmill.errors import FoldmillError
from foldmill.moe.data.corpus import load_meta
from foldmill.moe.data.tokenizers import BOS


class PackedWindows:
    """Windows of `seq_len + 1` tokens over the memory-mapped shards of one split."""

    def __init__(self, corpus_dir: str | Path, split: str, seq_len: int) -> None:
        meta = load_meta(corpus_dir)
        self.seq_len = seq_len
        self.shards = [np.load(Path(corpus_dir) / name, mmap_mode="r") for name in meta["splits"][split]["shards"]]
        counts = [max((shard.size - 1) // seq_len, 0) for shard in self.shards]
        self.shard_of = np.repeat(np.arange(len(self.shards)), counts)
        self.offset_of = np.concatenate([np.arange(n) * seq_len for n in counts]) if counts else np.zeros(0, int)
        if not len(self):
            raise FoldmillError(
                f"{corpus_dir}: the {split} split has no window of {seq_len + 1} tokens; use a shorter seq_len"
            )

    def __len__(self) -> int:
        return self.shard_of.size

    def window(self, index: int) -> np.ndarray:
        start = int(self.offset_of[index])
        return np.asarray(self.shards[int(self.shard_of[index])][start : start + self.seq_len + 1])

    def batch(self, indices: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.stack([self.window(int(i)) for i in indices]).astype(np.int64))


def document_ids(tokens: torch.Tensor) -> torch.Tensor:
    """Which packed record each token of a window belongs to (int32, same shape as tokens).

    Records are stored <bos> sequence <eos>, so a new record starts at every <bos>; tokens before
    a window's first <bos> are the tail of a record cut by the window start.
    """
    return torch.cumsum(tokens == BOS, dim=-1, dtype=torch.int32)


class BatchSampler:
    """Endless batches of window indices for one process; state_dict() / load_state_dict() resume it."""

    def __init__(self, num_windows: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        self.num_windows, self.batch_size = num_windows, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch, self.position = 0, 0
        self._order = self._epoch_order()

    def _epoch_order(self) -> np.ndarray:
        permutation = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_windows)
        mine = permutation[self.rank :: self.world_size]
        if not mine.size:
            raise FoldmillError(f"{self.num_windows} windows cannot feed {self.world_size} processes")
        return mine

    def next_indices(self) -> np.ndarray:
        picked: list[np.ndarray] = []
        needed = self.batch_size
        while needed:
            take = self._order[self.position : self.position + needed]
            picked.append(take)
            needed -= take.size
            self.position += take.size
            if self.position >= self._order.size:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._epoch_order()
        return np.concatenate(picked)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        # A position counts this process's windows; the epoch has used position * world_size in all.
        consumed = int(state["position"]) * int(state.get("world_size", self.world_size))
        self.epoch, self.position = int(state["epoch"]), consumed // self.world_size
        self._order = self._epoch_order()
