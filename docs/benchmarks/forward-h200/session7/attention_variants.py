"""Session 7 device micro-benchmark: variants of the flash triangle-attention kernel's inner loop.

The shipped kernel (foldmill.kernels.triton_triangle_attention_kernel) is the baseline. Each variant
toggles one inner-loop choice (constexpr flags below) in a copy of its loop; all read the same
inputs (1 x N rows x 4 heads x 32, gated, bf16, as the model hands them over). Per variant, block
configuration and size: steady milliseconds, and the relative error against an fp32 reference on
64 rows (the shipped kernel's error printed beside it).

    LOG2    logits in log2 units: scale * log2(e) folded into q, bias tile times log2(e) once for both
            rows; p = exp2(logits - max) with no clamp (no FMA contraction is left to guard)
    KB_ADD  the key bias as a broadcast fp32 add instead of a rank-1 tensor-core product
    BOTH    both rows' logits products issued before either softmax (tensor cores overlap the ALUs)
    EXP16   p = exp2 in packed bf16 (ex2.approx.ftz.bf16x2: twice MUFU's fp32 rate), row sums from it

Usage (device): python3 attention_variants.py OUT_DIR 1024,1700,2560 [shipped]   (shipped: that kernel only)
"""

import itertools
import math
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from foldmill.kernels import triton_triangle_attention_kernel as shipped

LOG2E = tl.constexpr(1.4426950408889634)
RANK1 = tl.constexpr(16)


@triton.jit
def _exp2(x, EXP16: tl.constexpr):
    if EXP16:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.bf16x2 $0, $1;", "=r,r", [x.to(tl.bfloat16)], dtype=tl.bfloat16, is_pure=True, pack=2
        )
    return tl.math.exp2(x)


@triton.jit
def _logits(q, k_row, k_stride_j, key_bias, key, key_ok, dim, ones, bias, KB_ADD: tl.constexpr):
    k_t = tl.load(k_row + key[None, :] * k_stride_j + dim[:, None], mask=key_ok[None, :], other=0.0)
    logits = tl.dot(q, k_t, bias)
    if KB_ADD:
        logits = logits + key_bias.to(tl.float32)[None, :]
    else:
        first_row = tl.arange(0, RANK1)[:, None] == 0
        logits = tl.dot(ones, tl.where(first_row, key_bias[None, :], 0.0).to(q.dtype), logits)
    return logits


@triton.jit
def _update(logits, v_row, v_stride_j, key, key_ok, dim, running_max, running_sum, acc, LOG2: tl.constexpr, EXP16: tl.constexpr):
    new_max = tl.maximum(running_max, tl.max(logits, axis=1))
    if LOG2:
        correction = tl.math.exp2(running_max - new_max)
        p = _exp2(logits - new_max[:, None], EXP16)
    else:
        new_max_log2 = new_max * LOG2E
        correction = tl.math.exp2(tl.minimum(running_max * LOG2E - new_max_log2, 0.0))
        p = _exp2(tl.minimum(logits * LOG2E - new_max_log2[:, None], 0.0), EXP16)
    running_sum = running_sum * correction + tl.sum(p.to(tl.float32), axis=1)
    v = tl.load(v_row + key[:, None] * v_stride_j + dim[None, :], mask=key_ok[:, None], other=0.0)
    acc = tl.dot(p.to(v.dtype), v, acc * correction[:, None])
    return new_max, running_sum, acc


@triton.jit(do_not_specialize=["rows", "queries", "keys"])
def _variant_kernel(
    q_ptr, k_ptr, v_ptr, bias_ptr, key_bias_ptr, gate_ptr, out_ptr, rows, queries, keys, scale,
    qsb, qsi, qsh, qsj, ksb, ksi, ksh, ksj, vsb, vsi, vsh, vsj, bsb, bsh, bsq, kbsb, kbsi, gsb, gsi, gsj,
    osb, osi, osj,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP_QUERIES: tl.constexpr, ALIGN: tl.constexpr, LOG2: tl.constexpr, KB_ADD: tl.constexpr, BOTH: tl.constexpr, EXP16: tl.constexpr,
):  # fmt: skip
    keys = (keys // ALIGN) * ALIGN
    bsq = (bsq // ALIGN) * ALIGN
    query_blocks = tl.cdiv(queries, BLOCK_M)
    row_pairs = tl.cdiv(rows, 2)
    group_blocks: tl.constexpr = max(GROUP_QUERIES // BLOCK_M, 1)
    pid = tl.program_id(0)
    per_head = row_pairs * query_blocks
    batch_head = pid // per_head
    in_head = pid % per_head
    first_block = (in_head // (group_blocks * row_pairs)) * group_blocks
    blocks_here = min(query_blocks - first_block, group_blocks)
    in_group = in_head - first_block * row_pairs
    query_block = first_block + in_group % blocks_here
    row0 = (in_group // blocks_here) * 2
    row1 = tl.minimum(row0 + 1, rows - 1)
    batch = (batch_head // HEADS).to(tl.int64)
    head = (batch_head % HEADS).to(tl.int64)
    row0 = row0.to(tl.int64)
    row1 = row1.to(tl.int64)
    dtype = out_ptr.dtype.element_ty
    query = query_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dim = tl.arange(0, HEAD_DIM)
    query_ok = query < queries
    q_scale = scale
    if LOG2:
        q_scale = scale * LOG2E
    q_head = q_ptr + batch * qsb + head * qsh + query[:, None] * qsj + dim[None, :]
    q0 = (tl.load(q_head + row0 * qsi, mask=query_ok[:, None], other=0.0) * q_scale).to(dtype)
    q1 = (tl.load(q_head + row1 * qsi, mask=query_ok[:, None], other=0.0) * q_scale).to(dtype)
    k_head = k_ptr + batch * ksb + head * ksh
    v_head = v_ptr + batch * vsb + head * vsh
    kb_row0 = key_bias_ptr + batch * kbsb + row0 * kbsi
    kb_row1 = key_bias_ptr + batch * kbsb + row1 * kbsi
    ones = tl.full((BLOCK_M, RANK1), 1.0, dtype)
    last_query = tl.minimum(query, queries - 1)
    bias_rows = bias_ptr + batch * bsb + head * bsh + last_query[:, None] * bsq
    max0 = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    sum0 = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc0 = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    max1, sum1, acc1 = max0, sum0, acc0
    key = tl.arange(0, BLOCK_N)
    bias = tl.load(bias_rows + key[None, :], mask=(key < keys)[None, :], other=0.0)
    kb0 = tl.load(kb_row0 + key)
    kb1 = tl.load(kb_row1 + key)
    for start in range(0, keys, BLOCK_N):
        key = start + tl.arange(0, BLOCK_N)
        key_ok = key < keys
        next_key = key + BLOCK_N
        next_bias = tl.load(bias_rows + next_key[None, :], mask=(next_key < keys)[None, :], other=0.0)
        next_kb0 = tl.load(kb_row0 + next_key)
        next_kb1 = tl.load(kb_row1 + next_key)
        bias_f32 = bias.to(tl.float32)
        if LOG2:
            bias_f32 = bias_f32 * LOG2E
        if BOTH:
            logits0 = _logits(q0, k_head + row0 * ksi, ksj, kb0, key, key_ok, dim, ones, bias_f32, KB_ADD)
            logits1 = _logits(q1, k_head + row1 * ksi, ksj, kb1, key, key_ok, dim, ones, bias_f32, KB_ADD)
            max0, sum0, acc0 = _update(logits0, v_head + row0 * vsi, vsj, key, key_ok, dim, max0, sum0, acc0, LOG2, EXP16)
            max1, sum1, acc1 = _update(logits1, v_head + row1 * vsi, vsj, key, key_ok, dim, max1, sum1, acc1, LOG2, EXP16)
        else:
            logits0 = _logits(q0, k_head + row0 * ksi, ksj, kb0, key, key_ok, dim, ones, bias_f32, KB_ADD)
            max0, sum0, acc0 = _update(logits0, v_head + row0 * vsi, vsj, key, key_ok, dim, max0, sum0, acc0, LOG2, EXP16)
            logits1 = _logits(q1, k_head + row1 * ksi, ksj, kb1, key, key_ok, dim, ones, bias_f32, KB_ADD)
            max1, sum1, acc1 = _update(logits1, v_head + row1 * vsi, vsj, key, key_ok, dim, max1, sum1, acc1, LOG2, EXP16)
        bias = next_bias
        kb0 = next_kb0
        kb1 = next_kb1
    out_head = out_ptr + batch * osb + head * HEAD_DIM + query[:, None] * osj + dim[None, :]
    gate_head = gate_ptr + batch * gsb + head * HEAD_DIM + query[:, None] * gsj + dim[None, :]
    g0 = tl.load(gate_head + row0 * gsi, mask=query_ok[:, None], other=0.0).to(tl.float32)
    tl.store(out_head + row0 * osi, (acc0 / sum0[:, None] * tl.sigmoid(g0)).to(dtype), mask=query_ok[:, None])
    g1 = tl.load(gate_head + row1 * gsi, mask=query_ok[:, None], other=0.0).to(tl.float32)
    tl.store(out_head + row1 * osi, (acc1 / sum1[:, None] * tl.sigmoid(g1)).to(dtype), mask=query_ok[:, None])


def variant(q, k, v, bias, mask, scale, gate, config, flags):
    batch, rows, heads, queries, head_dim = q.shape
    keys = k.shape[-2]
    out = torch.empty(batch, rows, queries, heads * head_dim, device=q.device, dtype=q.dtype)
    key_biases = shipped._key_bias(mask, batch, rows, keys, q.dtype)
    grid = (batch * heads * triton.cdiv(rows, 2) * triton.cdiv(queries, config[0]),)
    _variant_kernel[grid](
        q, k, v, bias, key_biases, gate, out, rows, queries, keys, scale,
        *q.stride()[:4], *k.stride()[:4], *v.stride()[:4], bias.stride(0), *bias.stride()[2:4],
        *key_biases.stride()[:2], *gate.stride()[:3], out.stride(0), out.stride(1), out.stride(2),
        HEADS=heads, HEAD_DIM=head_dim, BLOCK_M=config[0], BLOCK_N=config[1], GROUP_QUERIES=shipped.GROUP_QUERIES,
        ALIGN=math.gcd(16, keys, *bias.stride()[:-1]),
        num_warps=config[2], num_stages=config[3], **flags,
    )  # fmt: skip
    return out


def timed(fn, reps=3):
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps


def reference(q, k, v, bias, mask, scale, gate, rows):
    """fp32 gated attention on the first `rows` rows, in the (B, I, J, H*D) layout."""
    qf, kf, vf = (t[:, :rows].float() for t in (q, k, v))
    logits = torch.einsum("bihqd,bihkd->bihqk", qf * scale, kf) + bias.float()
    logits = logits.masked_fill(~mask[:, :rows], -1e9)
    out = torch.einsum("bihqk,bihkd->bihqd", logits.softmax(-1), vf)
    out = out.permute(0, 1, 3, 2, 4).flatten(3)
    return out * torch.sigmoid(gate[:, :rows].float())


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = [int(v) for v in sys.argv[2].split(",")]
    shipped_only = sys.argv[3:] == ["shipped"]
    dev = torch.device("cuda")
    heads, d = 4, 32
    configs = {"64x64w4s3": (64, 64, 4, 3), "128x128w8s2": (128, 128, 8, 2), "64x128w4s3": (64, 128, 4, 3)}
    names = ("LOG2", "KB_ADD", "BOTH", "EXP16")
    report = []
    for n in sizes:
        torch.manual_seed(n)
        projected = torch.randn(1, n, n, 4 * heads * d, device=dev, dtype=torch.bfloat16)
        q, k, v, gate = (t.unflatten(-1, (heads, d)).transpose(2, 3) for t in projected.chunk(4, dim=-1))
        gate = projected[..., 3 * heads * d:]
        bias = (2 * torch.randn(1, n, n, heads, device=dev)).to(torch.bfloat16).permute(0, 3, 1, 2).unsqueeze(1)
        bias = bias.contiguous()
        mask = torch.ones(1, n, 1, 1, n, device=dev, dtype=torch.bool)
        mask[..., n - n // 16:] = False  # padding keys, as a padded target has
        mask[:, -1] = False  # a padding row: no valid key (its output only needs to be finite)
        scale = d**-0.5
        ref_rows = 16
        ref = reference(q, k, v, bias, mask, scale, gate, ref_rows)
        base = lambda: shipped.flash_triangle_attention(q, k, v, bias, mask, scale, torch.bfloat16, gate=gate)  # noqa: E731
        t0 = time.perf_counter()
        base_out = base()
        torch.cuda.synchronize()
        row = {"tokens": n, "shipped_first_s": round(time.perf_counter() - t0, 2), "shipped_autotuned_ms": round(timed(base), 3),
               "shipped_error": round(float((base_out[:, :ref_rows].float() - ref).norm() / ref.norm()), 5)}  # fmt: skip
        print(json.dumps(row), flush=True)
        report.append(row)
        if not shipped_only:
            for bits in itertools.product((0, 1), repeat=len(names)):
                flags = dict(zip(names, bits))
                tag = "+".join(name for name, bit in flags.items() if bit) or "base"
                for cname, config in configs.items():
                    if cname == "64x128w4s3" and any(bits[:3]):
                        continue
                    call = lambda: variant(q, k, v, bias, mask, scale, gate, config, flags)  # noqa: E731
                    try:
                        t0 = time.perf_counter()
                        value = call()
                        torch.cuda.synchronize()
                        first = time.perf_counter() - t0
                        error = float((value[:, :ref_rows].float() - ref).norm() / ref.norm())
                        finite = bool(torch.isfinite(value).all())
                        entry = {"tokens": n, "variant": tag, "config": cname, "ms": round(timed(call), 3),
                                 "error": round(error, 5), "finite": finite, "first_s": round(first, 2)}  # fmt: skip
                    except Exception as exc:  # noqa: BLE001 - a variant that does not compile is a result too
                        entry = {"tokens": n, "variant": tag, "config": cname, "failed": f"{type(exc).__name__}: {exc}"[:300]}
                    print(json.dumps(entry), flush=True)
                    report.append(entry)
        del projected, q, k, v, gate, bias, base_out
        torch.cuda.empty_cache()
        (out_dir / "attention_variants.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
