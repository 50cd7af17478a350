"""`foldmill bench moe`: foldmill's MoE experts against Hugging Face Mixtral on one GPU.

Three sections, same shapes for every contender, each timed with CUDA events (median):
  gemm   grouped GEMM alone: bf16 grouped_mm, FP8 row-wise, MXFP8 (Triton; fp8/bf16 MMA modes)
  layer  MoE layer forward + backward: HF MixtralSparseMoeBlock (eager, grouped_mm) vs foldmill
         MoEBlock (grouped, fp8_rowwise, mxfp8), same weights
  step   full training step (forward, backward, AdamW) of a decoder: HF MixtralForCausalLM vs foldmill
TFLOP/s counts model FLOPs only; MFU is against --peak-tflops (measured bf16 dense rate of an H200).
Writes moe_bench.json and moe_bench.md to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from foldmill.errors import FoldmillError
from foldmill.io.atomic import write_text_atomic
from foldmill.moe.config import ModelConfig, model_config
from foldmill.runtime.timing import cuda_median_ms


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("moe", help="MoE experts and training step vs Hugging Face Mixtral (GPU)")
    parser.add_argument("--out", default="results/bench/moe", help="directory for moe_bench.json and moe_bench.md")
    parser.add_argument("--sections", default="gemm,layer,step", help="comma-separated: gemm, layer, step")
    parser.add_argument("--layer-shapes", default="mixtral_8x7b_layer,bio_8x1b", help="model configs for the layer section")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per layer call / per training step")
    parser.add_argument("--step-model", default="bio_8x1b", help="model config for the full training step")
    parser.add_argument("--step-layers", type=int, default=0, help="override the step model's layer count (0 = keep)")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--backends", default="grouped,fp8_rowwise,mxfp8")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.set_defaults(handler=run)


def _guarded(results: list[dict], row: dict, measure: Callable[[], dict]) -> None:
    """Run one measurement; a failure is recorded in its row instead of ending the benchmark."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        row.update(measure())
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    except Exception as error:  # the table must still come out; the error names what failed
        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        traceback.print_exc()
    results.append(row)
    print(json.dumps(row), flush=True)


# ---------------------------------------------------------------- gemm


def bench_gemm(repeats: int, peak: float) -> list[dict]:
    import torch.nn.functional as F

    from foldmill.moe.experts.fp8_rowwise import scaled_grouped_mm_rowwise
    from foldmill.moe.experts.mxfp8 import mx_grouped_mm, mx_grouped_mm_wgrad, quantize
    from foldmill.moe.quant.fp8 import quantize_rowwise

    results: list[dict] = []
    for experts, rows_per_expert, k, n in ((8, 4096, 4096, 14336), (8, 4096, 2048, 8192), (8, 2048, 1024, 4096)):
        device = torch.device("cuda")
        m = experts * rows_per_expert
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(experts, n, k, device=device, dtype=torch.bfloat16) * 0.02
        ends = torch.arange(1, experts + 1, device=device, dtype=torch.int32) * rows_per_expert
        flops = 2.0 * m * n * k
        shape = f"M={m} ({experts}x{rows_per_expert}) K={k} N={n}"

        def record(name: str, fn: Callable[[], object], **extra: object) -> None:
            def measure() -> dict:
                ms = cuda_median_ms(fn, repeats)
                return {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1), **extra}

            _guarded(results, {"section": "gemm", "shape": shape, "variant": name}, measure)

        record("bf16 grouped_mm", lambda: F.grouped_mm(x, w.transpose(-2, -1), offs=ends))
        x8, xs = quantize_rowwise(x)
        w8, ws = quantize_rowwise(w)
        record("fp8 rowwise (GEMM only)", lambda: torch._scaled_grouped_mm(
            x8, w8.transpose(-2, -1), xs, ws, offs=ends, out_dtype=torch.bfloat16))
        record("fp8 rowwise (with quantization)", lambda: scaled_grouped_mm_rowwise(x, w, ends, torch.bfloat16))
        xq, wq = quantize(x), quantize(w)
        reference = F.grouped_mm(xq.dequantize(torch.bfloat16), wq.dequantize(torch.bfloat16).transpose(-2, -1),
                                 offs=ends).float()
        for mode in ("fp8", "bf16", "scaled"):
            os.environ["FOLDMILL_MX_MMA"] = mode
            out = mx_grouped_mm(xq, wq, ends, torch.bfloat16).float()
            error = float((out - reference).norm() / reference.norm())
            record(f"mxfp8 triton {mode}-MMA (GEMM only)", lambda: mx_grouped_mm(xq, wq, ends, torch.bfloat16),
                   rel_error_vs_dequantized_bf16=round(error, 5))
        os.environ.pop("FOLDMILL_MX_MMA", None)
        record("mxfp8 quantize x and w", lambda: (quantize(x), quantize(w)))
        dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)
        dyq, xtq = quantize(dy.t()), quantize(x.t())
        record("mxfp8 triton wgrad (GEMM only)", lambda: mx_grouped_mm_wgrad(dyq, xtq, ends, torch.bfloat16))
        record("bf16 grouped_mm wgrad", lambda: F.grouped_mm(dy.t(), x, offs=ends))
        del x, w, x8, w8, xq, wq, dy, dyq, xtq
    for row in results:
        if "tflops" in row:
            row["mfu"] = round(row["tflops"] / peak, 3)
    return results


# ---------------------------------------------------------------- layer


def _hf_config(config: ModelConfig, layers: int, implementation: str):
    from transformers import MixtralConfig

    hf = MixtralConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.ffn_size,
        num_hidden_layers=layers, num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
        num_local_experts=config.num_experts, num_experts_per_tok=config.top_k, max_position_embeddings=config.max_seq_len,
        rope_theta=config.rope_theta, rms_norm_eps=config.norm_eps, router_aux_loss_coef=0.0, output_router_logits=False,
    )
    hf._experts_implementation = implementation
    hf._attn_implementation = "sdpa"
    return hf


def layer_flops(config: ModelConfig, tokens: int) -> float:
    """Forward + backward FLOPs of the experts: 6 x tokens x top_k x 3 x hidden x ffn."""
    return 6.0 * tokens * config.top_k * 3 * config.hidden_size * config.ffn_size


def bench_layer(shape: str, tokens: int, backends: list[str], repeats: int, peak: float) -> list[dict]:
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    from foldmill.moe.model.moe import MoEBlock

    config = model_config(shape)
    device = torch.device("cuda")
    results: list[dict] = []
    flops = layer_flops(config, tokens)
    x = torch.randn(1, tokens, config.hidden_size, device=device, dtype=torch.bfloat16)
    grad = torch.randn_like(x)
    torch.manual_seed(0)
    with torch.device(device):
        hf_block = MixtralSparseMoeBlock(_hf_config(config, 1, "eager")).to(torch.bfloat16)
    for parameter in hf_block.parameters():
        torch.nn.init.normal_(parameter, std=0.02)
    outputs: dict[str, torch.Tensor] = {}

    def fwd_bwd(module: torch.nn.Module, key: str) -> Callable[[], None]:
        inp = x.detach().requires_grad_()

        def run_once() -> None:
            out = module(inp)
            out = out[0] if isinstance(out, tuple) else out
            out = getattr(out, "hidden", out)
            out.backward(grad)
            outputs[key] = out.detach()
            inp.grad = None
            module.zero_grad(set_to_none=True)

        return run_once

    def row(name: str, fn: Callable[[], None]) -> None:
        def measure() -> dict:
            ms = cuda_median_ms(fn, repeats)
            return {"ms": round(ms, 3), "tokens_per_s": round(tokens / ms * 1e3), "tflops": round(flops / ms / 1e9, 1),
                    "mfu": round(flops / ms / 1e9 / peak, 3)}

        _guarded(results, {"section": "layer", "shape": f"{shape} ({tokens} tokens)", "variant": name}, measure)

    for implementation in ("eager", "grouped_mm"):
        hf_block.experts.config._experts_implementation = implementation
        row(f"HF {implementation}", fwd_bwd(hf_block, f"hf_{implementation}"))
    for backend in backends:
        block = MoEBlock(dataclasses.replace(config, expert_backend=backend)).to(device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            block.router.gate.weight.copy_(hf_block.gate.weight)
            block.experts.gate_up_proj.copy_(hf_block.experts.gate_up_proj)
            block.experts.down_proj.copy_(hf_block.experts.down_proj)
        row(f"foldmill {backend}", fwd_bwd(block, backend))
        del block
    reference = outputs.get("hf_eager")
    if reference is not None:
        for result in results:
            key = result["variant"].replace("HF ", "hf_").replace("foldmill ", "")
            if key in outputs:
                difference = (outputs[key].float() - reference.float()).norm() / reference.float().norm()
                result["rel_diff_vs_hf_eager"] = round(float(difference), 5)
    add_speedups(results)
    return results


def add_speedups(results: list[dict]) -> None:
    """speedup_vs_eager / speedup_vs_grouped_mm: HF's time over each row's time."""
    base = {r["variant"]: r.get("ms") for r in results}
    for result in results:
        for implementation in ("eager", "grouped_mm"):
            if "ms" in result and base.get(f"HF {implementation}"):
                result[f"speedup_vs_{implementation}"] = round(base[f"HF {implementation}"] / result["ms"], 2)


# ---------------------------------------------------------------- step


def bench_step(name: str, layers: int, tokens: int, seq_len: int, backends: list[str], repeats: int,
               peak: float) -> list[dict]:
    from transformers import MixtralForCausalLM

    from foldmill.moe.model.decoder import MoEDecoder
    from foldmill.moe.train.metrics import flops_per_token

    config = model_config(name, max_seq_len=seq_len, **({"num_layers": layers} if layers else {}))
    device = torch.device("cuda")
    batch = max(tokens // seq_len, 1)
    data = torch.randint(4, config.vocab_size, (batch, seq_len + 1), device=device)
    flops = flops_per_token(config, seq_len) * batch * seq_len
    results: list[dict] = []
    label = f"{name} x{config.num_layers} layers, {batch}x{seq_len} tokens, bf16 params + AdamW"

    def train_step_fn(model: torch.nn.Module, hf: bool) -> Callable[[], None]:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step() -> None:
            if hf:
                loss = model(input_ids=data[:, :-1], labels=data[:, :-1]).loss
            else:
                logits = model(data[:, :-1]).logits
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), data[:, 1:].flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    def row(variant: str, build: Callable[[], tuple[torch.nn.Module, bool]]) -> None:
        def measure() -> dict:
            model, hf = build()
            ms = cuda_median_ms(train_step_fn(model, hf), repeats, warmup=3)
            rate = batch * seq_len / ms * 1e3
            return {"ms": round(ms, 2), "tokens_per_s": round(rate), "tflops": round(flops / ms / 1e9, 1),
                    "mfu": round(flops / ms / 1e9 / peak, 3)}

        _guarded(results, {"section": "step", "shape": label, "variant": variant}, measure)

    def hf_model(implementation: str) -> Callable[[], tuple[torch.nn.Module, bool]]:
        def build() -> tuple[torch.nn.Module, bool]:
            with torch.device(device):
                return MixtralForCausalLM(_hf_config(config, config.num_layers, implementation)).to(torch.bfloat16), True

        return build

    def foldmill_model(backend: str) -> Callable[[], tuple[torch.nn.Module, bool]]:
        def build() -> tuple[torch.nn.Module, bool]:
            with torch.device(device):
                return MoEDecoder(dataclasses.replace(config, expert_backend=backend)).to(torch.bfloat16), False

        return build

    for implementation in ("eager", "grouped_mm"):
        row(f"HF {implementation}", hf_model(implementation))
    for backend in backends:
        row(f"foldmill {backend}", foldmill_model(backend))
    add_speedups(results)
    return results


# ---------------------------------------------------------------- report


def markdown_table(rows: list[dict]) -> str:
    columns = ["section", "shape", "variant", "ms", "tokens_per_s", "tflops", "mfu", "speedup_vs_eager",
               "speedup_vs_grouped_mm", "peak_memory_gib",
               "rel_error_vs_dequantized_bf16", "rel_diff_vs_hf_eager", "error"]
    used = [c for c in columns if any(c in r for r in rows)]
    lines = ["| " + " | ".join(used) + " |", "|" + "---|" * len(used)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in used) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise FoldmillError("foldmill bench moe needs a CUDA GPU")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sections = set(args.sections.split(","))
    backends = [b for b in args.backends.split(",") if b]
    rows: list[dict] = []
    device_name = torch.cuda.get_device_name()

    def save() -> None:
        payload = {"device": device_name, "torch": torch.__version__, "rows": rows}
        write_text_atomic(out / "moe_bench.json", json.dumps(payload, indent=2) + "\n")
        write_text_atomic(out / "moe_bench.md", f"Device: {device_name}, torch {torch.__version__}\n\n" + markdown_table(rows))

    if "gemm" in sections:
        rows += bench_gemm(args.repeats, args.peak_tflops)
        save()
    if "layer" in sections:
        for shape in args.layer_shapes.split(","):
            rows += bench_layer(shape, args.tokens, backends, args.repeats, args.peak_tflops)
            save()
    if "step" in sections:
        rows += bench_step(args.step_model, args.step_layers, args.tokens, args.seq_len, backends, args.repeats,
                           args.peak_tflops)
        save()
    print(markdown_table(rows))
    return 0
