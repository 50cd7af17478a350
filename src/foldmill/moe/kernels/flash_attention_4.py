"""The decoder's attention on FlashAttention 4's kernels (ModelConfig.attention = "flash_attn_4").

flash-attn-4 (`pip install flash-attn-4`, the CuTe DSL package `flash_attn.cute`) runs FlashAttention
3's Hopper design: warp-specialised producer and consumer warpgroups, the softmax of one tile
overlapped with the GEMMs of the next. It takes q, k and v in the projections' own (batch, seq,
heads, head_dim) layout and grouped-query heads as they are, so nothing is transposed or repeated.

Causal windows call it with causal=True. Packed records (document ids) reuse the block mask that
foldmill's FlexAttention path builds on the device (model.attention.document_mask): blocks it
leaves out are skipped, blocks it marks full run without a mask, and only the partial blocks (the
diagonal and the records' edges) evaluate `same_record_causal` per element. Every shape stays
fixed whatever the records, so a CUDA-graph-captured step replays it; variable-length attention
would need the number of records on the host.

Measured on an H100 (docs/benchmarks/moe.md, Attention kernels): causal windows 9% faster than
cuDNN's kernels per layer, 1.9% on the bio_8x1b step; packed records no faster than FlexAttention.
The trainer always packs records, so "torch" stays the default.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from foldmill.errors import FoldmillError, import_failure

# Compute capabilities whose FlashAttention 4 forward and backward kernels foldmill calls.
SUPPORTED_MAJORS = (9, 10)


def flash_attention_4(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, document_ids: torch.Tensor | None = None,
                      block_mask: object | None = None) -> torch.Tensor:
    """q (batch, seq, heads, dim), k/v (batch, seq, kv_heads, dim) -> (batch, seq, heads, dim): causal,
    or within each record of `document_ids` (batch, seq) given their FlexAttention `block_mask`.
    Callers check require_flash_attention_4 first (the decoder does, once per forward pass)."""
    from flash_attn.cute import flash_attn_func

    if document_ids is None:
        out, _ = flash_attn_func(q, k, v, causal=True)
        return out
    forward, backward = block_sparsity(block_mask)
    out, _ = flash_attn_func(q, k, v, mask_mod=_same_record_causal(), aux_tensors=[document_ids.to(torch.int32)],
                             block_sparse_tensors=forward, block_sparse_tensors_bwd=backward)
    return out


def require_flash_attention_4(device: torch.device) -> None:
    """Raise a one-line FoldmillError where FlashAttention 4 cannot run on `device`."""
    if device.type != "cuda":
        raise FoldmillError(f"moe attention flash_attn_4 runs on CUDA GPUs only, not on {device.type}")
    problem = _install_problem()
    if problem:
        raise FoldmillError(problem)
    major = torch.cuda.get_device_capability(device)[0]
    if major not in SUPPORTED_MAJORS:
        raise FoldmillError(f"moe attention flash_attn_4 needs a GPU of compute capability 9.x or 10.x "
                            f"(Hopper, Blackwell), not {major}.x; use attention torch")


def flash_attention_4_installed() -> bool:
    """Whether flash-attn-4's CuTe DSL package is installed (it may still fail to import)."""
    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except (ImportError, OSError, ValueError):  # a flash_attn package that fails to import
        return False


@functools.cache
def _install_problem() -> str | None:
    """Once per process, not per call."""
    if not flash_attention_4_installed():
        return "moe attention flash_attn_4 needs flash-attn-4: pip install flash-attn-4"
    failure = import_failure("flash_attn.cute")  # it loads CUTLASS's DSL
    if failure:
        return (f"moe attention flash_attn_4: flash-attn-4 is installed but does not import ({failure}); "
                f"reinstall flash-attn-4 and nvidia-cutlass-dsl together, or use attention torch")
    return None


def block_sparsity(block_mask: object) -> tuple[object, object]:
    """FlashAttention 4's block-sparse tensors for the forward (per query block, its key blocks) and
    the backward (per key block, its query blocks), read from a FlexAttention BlockMask: the two
    libraries share the layout (batch, heads, blocks[, blocks]) and the meaning of partial ("mask")
    and full blocks."""
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

    size = tuple(block_mask.BLOCK_SIZE)
    forward = BlockSparseTensorsTorch(block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
                                      block_mask.full_kv_indices, block_size=size)
    backward = BlockSparseTensorsTorch(block_mask.q_num_blocks, block_mask.q_indices, block_mask.full_q_num_blocks,
                                       block_mask.full_q_indices, block_size=size)
    return forward, backward


@functools.cache
def _same_record_causal():
    """The mask of the partial blocks: a query sees a key of its own record at or before it.
    Cached: FlashAttention 4 keys its compiled kernels on this function."""
    import cutlass
    from cutlass import cute
    from flash_attn.cute.utils import scalar_to_ssa

    @cute.jit
    def same_record_causal(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors):
        document_ids = aux_tensors[0]
        q_record = scalar_to_ssa(document_ids[batch[0], q_idx[0]], cutlass.Int32)
        kv_record = scalar_to_ssa(document_ids[batch[0], kv_idx[0]], cutlass.Int32)
        return (q_record == kv_record) & (q_idx >= kv_idx)

    return same_record_causal
