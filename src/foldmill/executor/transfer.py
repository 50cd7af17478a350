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
    if not tensor.any():
        return PackedTensor("zeros", shape, dtype)
    if tensor.dim() >= 1 and tensor.shape[-1] >= 2 and _is_one_hot(tensor):
        hot = tensor.to(torch.uint8).argmax(dim=-1)  # argmax takes no bool; 0/1 fit in uint8
        hot[~tensor.any(dim=-1)] = -1
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


def _is_one_hot(tensor: torch.Tensor) -> bool:
    """Every entry 0 or 1, and at most one 1 along the last dimension."""
    if not ((tensor == 0) | (tensor == 1)).all():
        return False
    return bool((tensor.sum(dim=-1, dtype=torch.int64) <= 1).all())


def _narrowest(low: int, high: int) -> torch.dtype:
    for dtype in NARROW_INTEGERS:
        info = torch.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return dtype
    return torch.int64
