"""The decoder's attention on FlashAttention 4 (ModelConfig.attention = "flash_attn_4").

On the CPU: the choice is validated and refused off CUDA in one line; where flash-attn-4 is
installed, its Hopper kernels compile with foldmill's record mask (the library's CPU-only
compilation mode) and read FlexAttention's block mask the right way round. On the GPU: the
decoder computes what it computes with torch's attention, and captured steps whose records change
between replays train as eager steps.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import relative_error
from test_moe_gpu import assert_captured_steps_train_as_eager

from foldmill.errors import FoldmillError
from foldmill.moe.config import ModelConfig
from foldmill.moe.data.loader import document_ids
from foldmill.moe.data.tokenizers import BOS
from foldmill.moe.kernels.flash_attention_4 import flash_attention_4_installed
from foldmill.moe.model.decoder import MoEDecoder

needs_flash_attention_4 = pytest.mark.skipif(not flash_attention_4_installed(),
                                             reason="needs flash-attn-4 (pip install flash-attn-4)")
CONFIG = ModelConfig(hidden_size=256, ffn_size=256, num_heads=2, num_kv_heads=1, max_seq_len=512)


def test_unknown_attention_kernels_are_refused_in_one_line() -> None:
    with pytest.raises(FoldmillError, match="attention must be one of torch, flash_attn_4, not 'flash'"):
        ModelConfig(attention="flash")


def test_flash_attention_4_off_cuda_is_a_one_line_error() -> None:
    model = MoEDecoder(dataclasses.replace(CONFIG, attention="flash_attn_4"))
    tokens = torch.randint(4, CONFIG.vocab_size, (1, 16))
    for documents in (None, torch.zeros(1, 16, dtype=torch.int32)):
        with pytest.raises(FoldmillError, match="flash_attn_4 runs on CUDA GPUs only, not on cpu"):
            model(tokens, documents)


def test_missing_flash_attention_4_and_other_gpus_are_one_line_errors(monkeypatch) -> None:
    from foldmill.moe.kernels import flash_attention_4 as module

    cuda = torch.device("cuda")
    install_problem = module._install_problem  # cached once per process; cleared around each case
    monkeypatch.setattr(module, "flash_attention_4_installed", lambda: False)
    install_problem.cache_clear()
    try:
        with pytest.raises(FoldmillError, match=r"needs flash-attn-4: pip install flash-attn-4$"):
            module.require_flash_attention_4(cuda)
        # installed, but its CuTe DSL package fails to import (CUTLASS's DSL missing or of another version)
        monkeypatch.setattr(module, "flash_attention_4_installed", lambda: True)
        monkeypatch.setitem(sys.modules, "flash_attn", None)
        install_problem.cache_clear()
        does_not_import = (r"^moe attention flash_attn_4: flash-attn-4 is installed but does not import "
                           r"\((ModuleNotFound|Import)Error: .*flash_attn.*\); reinstall .*use attention torch$")
        with pytest.raises(FoldmillError, match=does_not_import):
            module.require_flash_attention_4(cuda)
        monkeypatch.setattr(module, "_install_problem", lambda: None)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
        with pytest.raises(FoldmillError, match=r"compute capability 9.x or 10.x .*not 8.x; use attention torch$"):
            module.require_flash_attention_4(cuda)
    finally:
        install_problem.cache_clear()


@needs_flash_attention_4
def test_block_sparsity_reads_key_blocks_forward_and_query_blocks_backward() -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    from foldmill.moe.kernels.flash_attention_4 import block_sparsity

    ids = torch.repeat_interleave(torch.arange(3), torch.tensor([300, 500, 224])).unsqueeze(0)

    def same_record_causal(b, h, q, kv):
        return (ids[b, q] == ids[b, kv]) & (q >= kv)

    block_mask = create_block_mask(same_record_causal, 1, None, 1024, 1024, device="cpu")
    forward, backward = block_sparsity(block_mask)
    allowed = same_record_causal(0, 0, torch.arange(1024)[:, None], torch.arange(1024)[None, :])
    blocks = allowed.view(8, 128, 8, 128).transpose(1, 2)  # (query block, key block, 128, 128)
    for sparse, by_row in ((forward, blocks), (backward, blocks.transpose(0, 1))):
        assert sparse.block_size == (128, 128)
        for row in range(8):
            partial = set(sparse.mask_block_idx[0, 0, row, : sparse.mask_block_cnt[0, 0, row]].tolist())
            full = set(sparse.full_block_idx[0, 0, row, : sparse.full_block_cnt[0, 0, row]].tolist())
            assert full == {col for col in range(8) if by_row[row, col].all()}
            assert partial == {col for col in range(8) if by_row[row, col].any() and not by_row[row, col].all()}


@needs_flash_attention_4
@pytest.mark.parametrize("records", [False, True])
def test_hopper_kernels_compile_with_the_record_mask(records: bool) -> None:
    """Forward and backward for sm_90 at the bio_8x1b attention shape, compiled without a GPU. In a
    process of its own: CUTLASS's DSL reads its target architecture when first imported."""
    env = {**os.environ, "FLASH_ATTENTION_ARCH": "sm_90", "CUTE_DSL_ARCH": "sm_90a", "FLASH_ATTENTION_NUM_SMS": "132",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    code = f"import test_moe_flash_attention_4 as t; t.compile_for_hopper({records})"
    done = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["compiled"]


def compile_for_hopper(records: bool) -> None:
    """Compile FlashAttention 4's forward and backward (fake tensors: the library's CPU-only
    compilation mode) through its internal entry points, since autograd needs real CUDA tensors."""
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd
    from torch._subclasses.fake_tensor import FakeTensorMode

    from foldmill.moe.kernels.flash_attention_4 import _same_record_causal

    batch, seq, heads, kv_heads, dim, blocks = 2, 4096, 16, 8, 128, 32
    with FakeTensorMode():
        def empty(*shape, dtype=torch.bfloat16):
            return torch.empty(*shape, dtype=dtype, device="cuda")

        def sparse():  # partial and full blocks per row of blocks, as a FlexAttention BlockMask holds them
            if not records:
                return None
            counts, indices = (batch, 1, blocks), (batch, 1, blocks, blocks)
            return BlockSparseTensorsTorch(empty(*counts, dtype=torch.int32), empty(*indices, dtype=torch.int32),
                                           empty(*counts, dtype=torch.int32), empty(*indices, dtype=torch.int32),
                                           block_size=(128, 128))

        q, k, v = empty(batch, seq, heads, dim), empty(batch, seq, kv_heads, dim), empty(batch, seq, kv_heads, dim)
        mask = {"mask_mod": _same_record_causal(), "aux_tensors": [empty(batch, seq, dtype=torch.int32)]} \
            if records else {"causal": True}
        out, lse, *_ = _flash_attn_fwd(q, k, v, return_lse=True, block_sparse_tensors=sparse(), **mask)
        dq, dk, dv = _flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, block_sparse_tensors=sparse(),
                                     **mask)[:3]
    assert out.shape == dq.shape == q.shape and lse.shape == (batch, heads, seq)
    assert dk.shape == dv.shape == k.shape
    print("compiled")


def packed_batches(steps: int, batch: int, seq: int, vocab: int) -> torch.Tensor:
    """Token windows (steps, batch, seq + 1) of records of 20-300 tokens, each opened by <bos>:
    every batch packs its records differently."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, vocab, (steps, batch, seq + 1), generator=generator)
    starts = torch.rand(steps, batch, seq + 1, generator=generator) < 1 / 150
    return torch.where(starts, torch.full_like(tokens, BOS), tokens)


def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
@needs_flash_attention_4
@pytest.mark.parametrize("records", [False, True])
def test_decoder_on_flash_attention_4_matches_torch_attention(records: bool) -> None:
    _needs_cuda()
    torch.manual_seed(0)
    reference = MoEDecoder(CONFIG).to("cuda", torch.bfloat16)
    flash = MoEDecoder(dataclasses.replace(CONFIG, attention="flash_attn_4")).to("cuda", torch.bfloat16)
    flash.load_state_dict(reference.state_dict())
    batch = packed_batches(1, 2, 512, CONFIG.vocab_size)[0].cuda()
    inputs = batch[:, :-1]
    documents = document_ids(inputs) if records else None
    outputs = {}
    for name, model in (("torch", reference), ("flash_attn_4", flash)):
        logits = model(inputs, documents).logits
        F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten()).backward()
        outputs[name] = (logits.detach().float(), torch.cat([p.grad.float().flatten() for p in model.parameters()]))
    assert relative_error(outputs["flash_attn_4"][0], outputs["torch"][0]) < 1e-2
    assert relative_error(outputs["flash_attn_4"][1], outputs["torch"][1]) < 3e-2


@pytest.mark.gpu
@needs_flash_attention_4
def test_captured_steps_on_flash_attention_4_follow_the_records_of_each_batch() -> None:
    """moe.cuda_graphs with FlashAttention 4: the block mask is rebuilt on the device in every replay,
    so batches packed differently give the eager steps' losses and weights."""
    _needs_cuda()
    torch.manual_seed(0)
    config = dataclasses.replace(CONFIG, attention="flash_attn_4")
    eager = MoEDecoder(config).to("cuda", torch.bfloat16)

    def loss(model, batch):
        inputs = batch[:, :-1]
        logits = model(inputs, document_ids(inputs)).logits
        return (F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten()),)

    assert_captured_steps_train_as_eager(eager, loss, packed_batches(4, 2, 512, config.vocab_size).cuda())
