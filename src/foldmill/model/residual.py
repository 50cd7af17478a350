"""Residual adds into a pair tensor's own storage: one (N, N, token_z) fp32 tensor is 17 GiB at 6,000
tokens, so a stack that owns its z adds in place instead of holding the old and the new sum."""

from __future__ import annotations

import torch
from torch import Tensor


def accumulate(z: Tensor, update: Tensor, in_place: bool = True) -> Tensor:
    """z + update, into z's storage when `in_place` and the sum keeps z's dtype (z must then be the
    caller's to overwrite); the same values either way."""
    if in_place and torch.result_type(z, update) == z.dtype:
        return z.add_(update)
    return z + update
