"""Lossless compaction of a feature dict for its trip from a featurize actor to a model replica.

Boltz-2's features are dense: one-hot maps such as atom_to_token (atoms x tokens, int64) and
disto_target (tokens x tokens x 64 bins) make a 1,500-token target weigh about 1.3 GB, which Ray
would copy through its object store and the replica would deserialize while its GPU waits. Packed,
the same target is tens of MB: all-zero tensors travel as their shape, one-hot tensors as the index
of their hot entry, small integers in the narrowest integer type. The replica unpacks on its own
device, so the dense tensors are built where they are used. Unpacking gives back every tensor
exactly, with its dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NARROW_INTEGERS = (torch.int8, torch.int16, torch.int32)


@dataclass
class PackedTensor:
    kind: str  # raw | zeros | one_hot | narrow
    shape: tuple[int, ...]
    dtype: torch.dtype
    data: torch.Tensor | None = None  # the tensor (raw), its narrowed copy, or hot indices (-1 = none)

    @property
    def nbytes(self) -> int:
        return 0 if self.data is None else self.data.numel() * self.data.element_size()


def pack_tensor(tensor: torch.Tensor) -> PackedTensor:
    shape, dtype = tuple(tensor.shape), tensor.dtype
    if tensor.numel() == 0 or tensor.is_complex():
        return PackedTensor("raw", shape, dtype, tensor)
    nonzeros = int(torch.count_nonzero(tensor))
    if nonzeros == 0:
        return PackedTensor("zeros", shape, dtype)
    # One-hot along the last dimension has at most one non-zero per row: a cheap test first, as the
    # largest features (disto_target: tokens^2 x 64) are one-hot and packing them is on the way to a GPU.
    if tensor.dim() >= 1 and tensor.shape[-1] >= 2 and nonzeros <= tensor.numel() // tensor.shape[-1]:
        hot = _hot_indices(tensor)
        if hot is not None:
            return PackedTensor("one_hot", shape, dtype, hot.to(_narrowest(-1, tensor.shape[-1] - 1)))
    if not tensor.is_floating_point() and tensor.dtype != torch.bool:
        narrow = _narrowest(int(tensor.min()), int(tensor.max()))
        if narrow.itemsize < tensor.element_size():
            return PackedTensor("narrow", shape, dtype, tensor.to(narrow))
    return PackedTensor("raw", shape, dtype, tensor)


def unpack_tensor(packed: PackedTensor, device: torch.device) -> torch.Tensor:
    if packed.kind == "zeros":
        return torch.zeros(packed.shape, dtype=packed.dtype, device=device)
    data = packed.data.to(device, non_blocking=True)
    if packed.kind == "one_hot":
        hot = data.long()
        dense = torch.nn.functional.one_hot(hot.clamp(min=0), packed.shape[-1]) * (hot >= 0).unsqueeze(-1)
        return dense.to(packed.dtype)
    return data.to(packed.dtype)


def pack_features(features: dict[str, torch.Tensor]) -> dict[str, PackedTensor]:
    return {name: pack_tensor(value) for name, value in features.items()}


def unpack_features(packed: dict[str, PackedTensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {name: unpack_tensor(value, device) for name, value in packed.items()}


def _hot_indices(tensor: torch.Tensor) -> torch.Tensor | None:
    """Where the 1 of each row (along the last dimension) is, -1 for a row of zeros; None unless every
    entry is 0 or 1 with at most one 1 per row."""
    flat = tensor.reshape(-1, tensor.shape[-1])
    rows, columns = flat.nonzero().unbind(dim=1)  # in row-major order
    if not bool((flat[rows, columns] == 1).all()):
        return None
    if not bool((rows[1:] > rows[:-1]).all()):  # sorted, so a row with two non-zeros repeats
        return None
    hot = torch.full((flat.shape[0],), -1, dtype=torch.int64)
    hot[rows] = columns
    return hot.view(tensor.shape[:-1])


def _narrowest(low: int, high: int) -> torch.dtype:
    for dtype in NARROW_INTEGERS:
        info = torch.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return dtype
    return torch.int64
