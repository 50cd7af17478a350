"""`foldmill bench moe`: foldmill's MoE experts against Hugging Face Mixtral on one GPU.

Sections, same shapes for every contender, timed with CUDA events (median) except the profile:
  gemm   one grouped linear layer per backend (forward; backward = dgrad + wgrad, quantization
         included), 8-bit weight copies, and the library GEMMs alone (contenders)
  layer  MoE layer forward + backward: HF MixtralSparseMoeBlock (eager, grouped_mm) vs foldmill
         MoEBlock (grouped, fp8_rowwise, mxfp8, and quack where QuACK is installed), same weights
  step   full training step (forward, backward, AdamW) of a decoder: HF MixtralForCausalLM vs foldmill
         (bf16 weights; the bf16-mixed rows as moe.precision's default trains); captured steps again
         with 4x the tokens, and of a model with Mixtral-8x7B's wider layers (--wide-step-model);
         where flash-attn-4 is installed, the captured bf16 step on FlashAttention 4's attention
  attention  one decoder layer's attention, forward and backward, at the step model's shape: foldmill's
         causal (torch SDPA) and within-records (FlexAttention) paths against FlexAttention's causal
         mask, torch's FlashAttention 2 backend and, where flash-attn-4 is installed, foldmill's
         attention on FlashAttention 4's CuTe DSL kernels and their variable-length attention
         (bench/_attention.py)
  profile  (not in the defaults) GPU time per kernel category of foldmill's captured step per backend
         and recipe (bf16, bf16-mixed), from a torch profiler trace
  host   (not in the defaults) foldmill's step per backend launched from Python: its GPU time beside
         the host's time to issue it, and the kernels and Triton kernels it launches; then under DDP
         over a process group of this process alone, launched from Python and captured as the
         trainer captures data-parallel steps
  kernels  (not in the defaults) the memory-bound kernels around the expert GEMMs (SwiGLU, 8-bit
         copies, dequantization) at the step model's and the wide model's shapes, in CUDA graphs,
         with the bytes they move per second (bench/_moe_kernels.py)
  quack-tiles  (not in the defaults; needs QuACK) each GEMM of the quack backend's expert MLP under
         each tile configuration QuACK's autotuner tries, at the step model's and the wide model's
         expert shapes, beside what the grouped backend runs instead, in CUDA graphs; about 280
         cases, some minutes (bench/_quack_tiles.py)
TFLOP/s counts model FLOPs only (document-masked rows: the attention pairs their records keep).
MFU columns: against the dense spec peak of the row's precision (989 bf16, 1,979 FP8; MXFP8 rows
count as 8-bit), against the bf16 spec peak, and against the 8192^3 GEMM rate of the row's
precision measured at the start of the run.
Writes moe_bench.json and moe_bench.md to --out.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import os
import traceback
import types
from collections.abc import Callable
from pathlib import Path

import torch

from foldmill.bench._attention import packed_records
from foldmill.bench._moe_kernels import check_kernel_tokens, kernel_cases, kernel_shape
from foldmill.bench._out_dir import writes_only_its_own
from foldmill.errors import FoldmillError
from foldmill.io.atomic import write_text_atomic
from foldmill.moe.config import EIGHT_BIT_BACKENDS, ModelConfig, model_config
from foldmill.moe.experts import GEMM_PRECISION
from foldmill.moe.experts.quack_fused import quack_installed
from foldmill.moe.kernels.flash_attention_4 import flash_attention_4_installed
from foldmill.moe.train.metrics import spec_peaks
from foldmill.runtime.timing import cuda_graph_median_ms, cuda_median_ms, host_median_ms


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("moe", help="MoE experts and training step vs Hugging Face Mixtral (GPU)")
    parser.add_argument("--out", default="results/bench/moe", help="directory for moe_bench.json and moe_bench.md")
    parser.add_argument("--sections", default="gemm,layer,step,attention",
                        help="comma-separated: gemm, layer, step, attention (one layer's attention per "
                             "implementation), profile (kernel time by category per step), host (host time "
                             "to launch a step from Python), "
                             "kernels (SwiGLU and 8-bit copy kernels alone), quack-tiles (tile configurations of "
                             "the quack backend's GEMMs)")
    parser.add_argument("--layer-shapes", default="mixtral_8x7b_layer,bio_8x1b", help="model configs for the layer section")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per layer call / per training step")
    parser.add_argument("--step-model", default="bio_8x1b", help="model config for the full training step")
    parser.add_argument("--step-layers", type=int, default=0, help="override the step model's layer count (0 = keep)")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--large-step-tokens", type=int, default=32768,
                        help="tokens per step of the larger-batch step rows: captured steps, HF grouped_mm (0 skips)")
    parser.add_argument("--wide-step-model", default="mixtral_8x7b_layer",
                        help="model config whose layer shape the wide step rows take, with the step model's "
                             "vocabulary: captured steps, HF grouped_mm, at both token counts ('' skips)")
    parser.add_argument("--wide-step-layers", type=int, default=4, help="layers of the wide step rows' model")
    parser.add_argument("--micro-batches", type=int, default=4,
                        help="step rows with this many micro-batches of --tokens per optimizer step, their gradients "
                             "summed (moe.gradient_accumulation_steps); 0 or 1 = none")
    parser.add_argument("--backends", default=None,
                        help="comma-separated expert backends (default: grouped,fp8_rowwise,mxfp8, and quack where "
                             "QuACK is installed)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.set_defaults(handler=writes_only_its_own(run))


def _clear_cublas_workspaces() -> None:
    """Return cuBLAS's cached workspaces to torch's allocator (they are made again on demand).

    cuBLAS keeps them per stream it has run on (32 MiB each on Hopper), from torch's cache, and each
    captured step warms up on another side stream: before each row of a run, 64 MiB more stayed
    allocated and about 0.28 GiB more stayed reserved after `torch.cuda.empty_cache()` (an H100,
    8 x 4,096-token rows)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # CUDA builds of torch only
    if clear is not None and torch.cuda.is_initialized():
        clear()


def _guarded(results: list[dict], row: dict, measure: Callable[[], dict]) -> None:
    """Run one measurement; a failure is recorded in its row instead of ending the benchmark.

    A row that does not fit the GPU's memory is an answer about that GPU (several rows need more
    than an 80 GB card), so its printed row is all that is said; any other failure also prints its
    traceback."""
    # Free the previous rows' models first (their autograd and CUDA-graph references form cycles)
    # so host-bound rows do not pay for collecting them.
    gc.collect()
    on_cuda = torch.cuda.is_available()
    if on_cuda:
        _clear_cublas_workspaces()  # after the previous row's CUDA graphs, which may run on them, are gone
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        row.update(measure())
        if on_cuda:
            row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    except torch.OutOfMemoryError as error:
        row["error"] = _error_line(error)
    except Exception as error:  # the table must still come out; the error names what failed
        row["error"] = _error_line(error)
        traceback.print_exc()
    results.append(row)
    print(json.dumps(row), flush=True)


def _error_line(error: Exception) -> str:
    """The error's type and the first line of its message, at most 200 characters of it."""
    message = str(error).splitlines()[0][:200] if str(error) else ""
    return f"{type(error).__name__}: {message}"


# ---------------------------------------------------------------- peaks and MFU

# A step row's model: (model, whether it is Hugging Face's, float32 masters of its bf16 weights).
Built = tuple[torch.nn.Module, bool, dict]
CONTENDER_MODULES = ("torchao", "transformer_engine", "cudnn", "cutlass", "tilelang", "quack", "flash_attn",
                     "deep_gemm")
# Contenders imported only by their own rows, which run after every other section. Importing
# Transformer Engine loads the first libcudnn it finds under CUDA_HOME or /usr/local/cuda, process
# wide: on an H200 whose toolkit held an older cuDNN than torch's, cuDNN frontend then reported
# that version and every later step row ran 5-10% slower (torch's attention is cuDNN's).
IMPORTED_LAST = ("transformer_engine",)


def measure_peaks(repeats: int) -> dict[str, float]:
    """Measured dense GEMM rates on this GPU (8192^3, random data): bf16 matmul and FP8 _scaled_mm."""
    size = 8192
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * size**3
    peaks = {"bf16": flops / cuda_median_ms(lambda: a @ b, repeats) / 1e9}
    a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t()
    ones_a, ones_b = torch.ones(size, 1, device="cuda"), torch.ones(1, size, device="cuda")
    # With fast accumulation: the higher of the two FP8 rates, so FP8 rows are not flattered.
    peaks["fp8"] = flops / cuda_median_ms(lambda: torch._scaled_mm(a8, b8, ones_a, ones_b, out_dtype=torch.bfloat16,
                                                                   use_fast_accum=True), repeats) / 1e9
    return {k: round(v, 1) for k, v in peaks.items()}


@functools.cache
def device_spec_peaks() -> dict[str, float]:
    """The dense spec peaks of this process's GPU (foldmill.moe.train.metrics.spec_peaks)."""
    return spec_peaks(torch.cuda.get_device_name())


def add_mfu(row: dict, precision: str, peaks: dict[str, float], spec: dict[str, float] | None = None) -> None:
    """MFU against the row precision's spec peak, the bf16 spec peak (`spec`: this GPU's by default;
    left out where not known), and the precision's measured peak (`peaks`)."""
    if "tflops" not in row:
        return
    spec = device_spec_peaks() if spec is None else spec
    row["precision"] = precision
    if spec.get(precision):
        row["mfu_spec"] = round(row["tflops"] / spec[precision], 3)
    if spec.get("bf16"):
        row["mfu_bf16_spec"] = round(row["tflops"] / spec["bf16"], 3)
    if peaks.get(precision):
        row["mfu_measured"] = round(row["tflops"] / peaks[precision], 3)


def available_contenders() -> dict[str, str]:
    """Which optional GEMM/attention libraries import here (version, or why not); those of
    IMPORTED_LAST are not imported, only looked up."""
    found = {}
    for name in CONTENDER_MODULES:
        if name in IMPORTED_LAST:
            try:
                found[name] = f"{importlib.metadata.version(name)} (imported after the other rows)"
            except importlib.metadata.PackageNotFoundError:
                found[name] = "not installed"
            continue
        try:
            module = importlib.import_module(name)
            found[name] = _module_version(module) or _distribution_version(name)
        except Exception as error:  # any import failure means the contender cannot run here
            found[name] = f"not importable ({type(error).__name__})"
    return found


def _module_version(module: types.ModuleType) -> str | None:
    """`module.__version__` where it is a version: a package built from source can keep its build's
    unfilled template (the CUTLASS DSL's front end reads "@CUTLASS_IR_WHEEL_RELEASE_VERSION@")."""
    version = str(getattr(module, "__version__", "") or "")
    return version if version[:1].isdigit() else None


def _distribution_version(module: str) -> str:
    """The version of the distributions that install `module` (flash-attn-4's flash_attn has no
    __version__), or "installed"."""
    names = importlib.metadata.packages_distributions().get(module, [])
    versions = [f"{name} {importlib.metadata.version(name)}" for name in sorted(set(names))]
    return ", ".join(versions) or "installed"


# ---------------------------------------------------------------- profile

# Kernel categories of the profile section: a kernel counts in the first category one of whose
# patterns occurs in its name. The 8-bit copies are foldmill's quantizer kernels
# (moe/kernels/fp8_quant.py, mx_quant.py; a test keeps this list complete).
KERNEL_CATEGORIES = (
    ("grouped expert GEMMs", ("GroupProblemShape", "prepare_grouped_gemm_data", "_grouped_forward_kernel",
                              "_grouped_wgrad_kernel", "quack")),
    ("8-bit copies", ("_rowwise_kernel", "_tile_maxima_kernel", "_scales_kernel",
                      "_cast_kernel", "_quantize_kernel", "_dual_kernel", "_dequantize_rows_kernel")),
    ("SwiGLU", ("_swiglu_",)),
    ("attention", ("sdpa", "fmha", "flash", "cudnn::fusion", "flex_attention", "triton_tem_")),
    ("AdamW", ("_adamw_kernel",)),
    ("dense GEMMs (projections, router, logits)", ("nvjet", "gemm", "xmma")),
    ("gradient norm", ("_sum_of_squares_kernel", "multi_tensor_apply")),
    ("norms", ("layer_norm", "rms_norm", "GammaBeta")),
    ("casts and copies", ("_upcast_kernel", "copy_kernel")),
)
OTHER_KERNELS = "other kernels"


def kernel_category(name: str) -> str:
    for category, patterns in KERNEL_CATEGORIES:
        if any(pattern in name for pattern in patterns):
            return category
    return OTHER_KERNELS


def kernel_times(step: Callable[[], None], steps: int = 3, warmup: int = 3) -> list[dict]:
    """Each kernel's GPU time and launches per step, longest first, from a torch profiler trace of
    `steps` calls of step() after `warmup` untimed ones."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    ms, launches = collections.Counter(), collections.Counter()
    for event in trace.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            ms[event.name] += event.device_time / 1e3 / steps
            launches[event.name] += 1
    return [{"kernel": name, "category": kernel_category(name), "ms": round(total, 4),
             "launches_per_step": launches[name] / steps} for name, total in ms.most_common()]


def triton_launches(step: Callable[[], None]) -> int:
    """Triton kernels one call of step() launches: each costs the host about twice a torch kernel's
    launch (docs/benchmarks/moe.md)."""
    import triton

    launches = 0

    def count(_metadata: object) -> None:
        nonlocal launches
        launches += 1

    triton.knobs.runtime.launch_enter_hook.add(count)
    try:
        step()
        torch.cuda.synchronize()
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(count)
    return launches


def ms_by_category(kernels: list[dict]) -> dict[str, float]:
    """GPU time per step of each kernel category of `kernel_times`'s kernels; "all kernels" is their
    sum (host gaps excluded)."""
    totals = dict.fromkeys([category for category, _ in KERNEL_CATEGORIES] + [OTHER_KERNELS], 0.0)
    for kernel in kernels:
        totals[kernel["category"]] += kernel["ms"]
    return {"all kernels": sum(totals.values()), **totals}


# ---------------------------------------------------------------- gemm

GEMM_SHAPES = ((8, 4096, 4096, 14336), (8, 2048, 2048, 8192), (8, 2048, 4096, 2048))


def bench_gemm(backends: list[str], repeats: int, peaks: dict[str, float], imported_last: bool = False) -> list[dict]:
    """Each backend's grouped linear layer (forward; backward = dgrad + wgrad; quantization included,
    weights' 8-bit copies cached as in training) and the library GEMMs alone, per shape;
    `imported_last`: only the rows of the IMPORTED_LAST libraries."""
    results: list[dict] = []
    for shape_index, shape in enumerate(GEMM_SHAPES):
        # Each shape's operands are freed (with its function's locals) before the next shape's.
        results += _bench_gemm_shape(*shape, backends, repeats, peaks, triton_mxfp8=shape_index == 0,
                                     imported_last=imported_last)
    return results


def _bench_gemm_shape(experts: int, rows_per_expert: int, k: int, n: int, backends: list[str], repeats: int,
                      peaks: dict[str, float], triton_mxfp8: bool, imported_last: bool) -> list[dict]:
    import torch.nn.functional as F

    from foldmill.moe.experts.mxfp8 import round_trip
    from foldmill.moe.quant.fp8 import quantize_weight_copies

    device = torch.device("cuda")
    m = experts * rows_per_expert
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(experts, n, k, device=device, dtype=torch.bfloat16) * 0.02
    dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    ends = torch.arange(1, experts + 1, device=device, dtype=torch.int32) * rows_per_expert
    flops = 2.0 * m * n * k
    shape = f"{experts}x{rows_per_expert} rows, K={k}, N={n}"
    results: list[dict] = []

    def record(name: str, fn: Callable[[], object] | None, precision: str, passes: int = 1,
               check: Callable[[], dict] | None = None, failure: Exception | None = None, **extra: object) -> None:
        """check: columns computed inside the row's guard (a contender that fails to build gets its error);
        failure: why the row could not be built, recorded as its error instead of a timing."""

        def measure() -> dict:
            if failure is not None:
                raise failure
            checked = {}
            if check is not None:
                checked = check()
                torch.cuda.reset_peak_memory_stats()  # the row's peak is its timed calls', not the check's
            ms = cuda_median_ms(fn, repeats)
            rate = {"tflops": round(passes * flops / ms / 1e9, 1)} if passes else {}
            return {"ms": round(ms, 3), **rate, **extra, **checked}

        row = {"section": "gemm", "shape": shape, "variant": name}
        _guarded(results, row, measure)
        add_mfu(row, precision, peaks)

    if imported_last:
        try:
            from foldmill.bench._te_grouped_linear import transformer_engine_rows
        except Exception as error:  # installed (the header says so) but not importable: a row says why
            record("Transformer Engine GroupedLinear", None, "bf16", passes=0, failure=error)
            return results
        transformer_engine_rows(record, _error_against, x, w, dy, ends)
        return results
    reference = F.grouped_mm(x.float(), w.float().transpose(-2, -1), offs=ends)
    for name in backends:
        _backend_rows(record, name, x, w, dy, ends, reference)
    del reference
    record("fp8 weight copies, both layouts (once per optimizer step)", functools.partial(quantize_weight_copies, w),
           "fp8", passes=0)
    record("mxfp8 weight copies, both layouts (once per optimizer step)", functools.partial(round_trip, w, True, True),
           "fp8", passes=0)
    # The building blocks alone: library GEMMs on ready operands.
    record("torch grouped_mm bf16 fwd", functools.partial(F.grouped_mm, x, w.transpose(-2, -1), offs=ends), "bf16")
    record("torch grouped_mm bf16 dgrad", functools.partial(F.grouped_mm, dy, w, offs=ends), "bf16")
    record("torch grouped_mm bf16 wgrad", functools.partial(F.grouped_mm, dy.t(), x, offs=ends), "bf16")
    _scaled_grouped_mm_rows(record, x, w, dy, ends)
    library_contenders(record, x, w, dy, ends)
    if triton_mxfp8:
        _triton_mxfp8_rows(record, x, w, ends)
    return results


def _backend_rows(record: Callable[..., None], name: str, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor,
                  ends: torch.Tensor, reference: torch.Tensor) -> None:
    """A foldmill backend's forward and backward, as its expert MLP calls them."""
    from foldmill.moe.experts import get_backend

    gemm = get_backend(name)
    out, saved = gemm.forward(x, w, ends)
    error = _relative_error(out, reference)
    del out
    record(f"foldmill {name} forward", functools.partial(gemm.forward, x, w, ends), GEMM_PRECISION[name],
           rel_error_vs_fp32=error)
    record(f"foldmill {name} backward (dgrad + wgrad)", functools.partial(gemm.backward, dy, w, saved, ends),
           GEMM_PRECISION[name], passes=2)


def _scaled_grouped_mm_rows(record: Callable[..., None], x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor,
                            ends: torch.Tensor) -> None:
    """torch's FP8 grouped GEMM on ready operands, with promoted and with fast accumulation."""
    from foldmill.moe.quant.fp8 import quantize_group_columns, quantize_rowwise, quantize_weight_columns

    x8, xs = quantize_rowwise(x)
    w8, ws = quantize_rowwise(w)
    dy8, dys = quantize_rowwise(dy)
    wt8, wts = quantize_weight_columns(w)
    dyt8, dyts = quantize_group_columns(dy, ends)
    xt8, xts = quantize_group_columns(x, ends)
    for fast, accumulation in ((False, "promoted"), (True, "fast")):
        scaled = functools.partial(torch._scaled_grouped_mm, offs=ends, out_dtype=torch.bfloat16, use_fast_accum=fast)
        record(f"torch _scaled_grouped_mm fp8 row-wise fwd, {accumulation} accumulation (GEMM only)",
               functools.partial(scaled, x8, w8.transpose(-2, -1), xs, ws), "fp8")
        record(f"torch _scaled_grouped_mm fp8 row-wise dgrad, {accumulation} accumulation (GEMM only)",
               functools.partial(scaled, dy8, wt8.transpose(-2, -1), dys, wts), "fp8")
        record(f"torch _scaled_grouped_mm fp8 per-group wgrad, {accumulation} accumulation (GEMM only)",
               functools.partial(scaled, dyt8, xt8.t(), dyts, xts), "fp8")


def _triton_mxfp8_rows(record: Callable[..., None], x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> None:
    """The Triton MXFP8 GEMMs that apply block scales on Hopper themselves (the sm100 path's kernel)."""
    from foldmill.moe.experts.mxfp8 import mx_grouped_mm, quantize

    xq, wq = quantize(x), quantize(w)
    for mode in ("fp8", "bf16"):
        os.environ["FOLDMILL_MX_MMA"] = mode
        try:
            record(f"triton mxfp8 {mode}-MMA fwd (GEMM only)",
                   functools.partial(mx_grouped_mm, xq, wq, ends, torch.bfloat16), "fp8")
        finally:
            os.environ.pop("FOLDMILL_MX_MMA", None)


def library_contenders(record: Callable[..., None], x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor,
                       ends: torch.Tensor) -> None:
    """Other libraries' MoE GEMMs on the same operands, where they import: torchao's FP8 row-wise
    grouped GEMM for MoE training (quantizes the weights on every call), cuDNN frontend's MoE
    grouped matmul (bf16), a TileLang grouped GEMM (bench/_tilelang_grouped_gemm.py, Hopper, bf16
    forward and dgrad) and DeepGEMM's block-scaled FP8 grouped GEMMs (bench/_deepgemm_grouped.py,
    Hopper). Transformer Engine's GroupedLinear per recipe (bench/_te_grouped_linear.py) runs after
    every other section (IMPORTED_LAST). QuACK's CuTe DSL GEMMs are measured as the `quack` backend.
    A library that imports but refuses the shape gets a row with its error."""
    import torch.nn.functional as F

    _to_fp8_rowwise_then_scaled_grouped_mm = _optional("torchao.prototype.moe_training.fp8_grouped_mm",
                                                       "_to_fp8_rowwise_then_scaled_grouped_mm")
    if _to_fp8_rowwise_then_scaled_grouped_mm is not None:
        def torchao_forward() -> torch.Tensor:
            with torch.no_grad():
                return _to_fp8_rowwise_then_scaled_grouped_mm(x, w.transpose(-2, -1), ends,
                                                              pad_token_groups_for_grouped_mm=False)

        x_leaf, w_leaf = x.detach().requires_grad_(), w.detach().requires_grad_()

        def torchao_forward_backward() -> None:
            _to_fp8_rowwise_then_scaled_grouped_mm(x_leaf, w_leaf.transpose(-2, -1), ends,
                                                   pad_token_groups_for_grouped_mm=False).backward(dy)
            x_leaf.grad = w_leaf.grad = None

        record("torchao fp8 row-wise forward (weights quantized on every call)", torchao_forward, "fp8")
        record("torchao fp8 row-wise forward + backward", torchao_forward_backward, "fp8", passes=3)
    moe_grouped_matmul = _optional("cudnn.gemm.ops.moe_grouped_matmul", "moe_grouped_matmul")
    if moe_grouped_matmul is not None:
        bounds = torch.cat([ends.new_zeros(1), ends]).view(-1, 1, 1)
        record("cuDNN frontend moe_grouped_matmul bf16 fwd",
               lambda: moe_grouped_matmul(x.unsqueeze(0), w.transpose(-2, -1), bounds), "bf16")
    tilelang_grouped_mm = _optional("foldmill.bench._tilelang_grouped_gemm", "tilelang_grouped_mm")
    if tilelang_grouped_mm is not None and torch.cuda.get_device_capability() == (9, 0):
        for direction, rows, transpose_w in (("fwd", x, True), ("dgrad", dy, False)):
            run = functools.partial(tilelang_grouped_mm(w, ends, transpose_w), rows)
            weights = w.float().transpose(-2, -1) if transpose_w else w.float()
            want = functools.partial(F.grouped_mm, rows.float(), weights, offs=ends)
            record(f"TileLang grouped GEMM bf16 {direction} (GEMM only)", run, "bf16",
                   check=functools.partial(_error_against, run, want))
    deepgemm_rows = _optional("foldmill.bench._deepgemm_grouped", "deepgemm_rows")
    if deepgemm_rows is not None and torch.cuda.get_device_capability() == (9, 0):
        deepgemm_rows(record, _error_against, x, w, dy, ends)


def _optional(module: str, name: str) -> Callable | None:
    """module.name, or None where the library is missing or does not import (built for another torch)."""
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:  # any import failure means the contender cannot run here
        return None


def _error_against(run: Callable[[], torch.Tensor], want: Callable[[], torch.Tensor]) -> dict:
    """run()'s error against want(), the float32 product it computes, as the row's column."""
    expected = want()
    return {"rel_error_vs_fp32": _relative_error(run(), expected)}


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """|value - reference| / |reference| in float32, to 5 decimals."""
    reference = reference.float()
    return round(float((value.float() - reference).norm() / reference.norm()), 5)


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


def bench_layer(shape: str, tokens: int, backends: list[str], repeats: int, peaks: dict[str, float]) -> list[dict]:
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

    def row(name: str, fn: Callable[[], None], precision: str) -> None:
        def measure() -> dict:
            ms = cuda_median_ms(fn, repeats)
            return {"ms": round(ms, 3), "tokens_per_s": round(tokens / ms * 1e3), "tflops": round(flops / ms / 1e9, 1)}

        result = {"section": "layer", "shape": f"{shape} ({tokens} tokens)", "variant": name}
        _guarded(results, result, measure)
        add_mfu(result, precision, peaks)

    for implementation in ("eager", "grouped_mm"):
        hf_block.experts.config._experts_implementation = implementation
        row(f"HF {implementation}", fwd_bwd(hf_block, f"hf_{implementation}"), "bf16")
    for backend in backends:
        block = MoEBlock(dataclasses.replace(config, expert_backend=backend)).to(device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            block.router.gate.weight.copy_(hf_block.gate.weight)
            block.experts.gate_up_proj.copy_(hf_block.experts.gate_up_proj)
            block.experts.down_proj.copy_(hf_block.experts.down_proj)
        row(f"foldmill {backend}", fwd_bwd(block, backend), GEMM_PRECISION[backend])
        del block
    reference = outputs.get("hf_eager")
    if reference is not None:
        for result in results:
            key = result["variant"].replace("HF ", "hf_").replace("foldmill ", "")
            if key in outputs:
                result["rel_diff_vs_hf_eager"] = _relative_error(outputs[key], reference)
    add_speedups(results)
    return results


def add_speedups(results: list[dict]) -> None:
    """speedup_vs_eager / _grouped_mm / _foldmill_grouped: that row's time over each row's time."""
    base = {r["variant"]: r.get("ms") for r in results}
    baselines = {"eager": "HF eager", "grouped_mm": "HF grouped_mm", "foldmill_grouped": "foldmill grouped"}
    for result in results:
        for key, variant in baselines.items():
            if "ms" in result and base.get(variant):
                result[f"speedup_vs_{key}"] = round(base[variant] / result["ms"], 2)


# ---------------------------------------------------------------- step


def bench_step(name: str, layers: int, tokens: int, seq_len: int, backends: list[str], repeats: int,
               peaks: dict[str, float], captured_only: bool = False, profile: bool = False,
               host: bool = False, vocab_size: int = 0, micro_batches: int = 1) -> list[dict]:
    """Training-step rows; `captured_only`: just HF grouped_mm and the CUDA-graph rows (larger batches,
    wider models, accumulated gradients); `profile`: instead, each backend's captured step's GPU time
    per kernel category; `host`: instead, each backend's step launched from Python, its GPU time beside
    its host's, alone and under DDP (launched from Python and captured); `layers`, `vocab_size`:
    overrides of the named config's (0 keeps its own); `micro_batches`: forward and backward passes
    of `tokens` each per optimizer step, their gradients summed (moe.gradient_accumulation_steps),
    for every row."""
    from transformers import MixtralForCausalLM

    from foldmill.moe.model.decoder import MoEDecoder
    from foldmill.moe.parallel.gradients import clip_factor
    from foldmill.moe.train.compile import compile_dense_blocks
    from foldmill.moe.train.distributed import Dist, one_process_group, wrap_model
    from foldmill.moe.train.graphs import CapturedForwardBackward, built_on_capture_stream
    from foldmill.moe.train.loss import accumulate_gradients, autocast
    from foldmill.moe.train.metrics import attended_fraction, flops_per_token
    from foldmill.moe.train.optim import AdamW
    from foldmill.moe.train.precision import prepare_parameters

    overrides = {key: value for key, value in (("num_layers", layers), ("vocab_size", vocab_size)) if value}
    config = model_config(name, max_seq_len=seq_len, **overrides)
    device = torch.device("cuda")
    this_gpu = torch.device("cuda", torch.cuda.current_device())  # DDP's device_ids need its index
    batch = max(tokens // seq_len, 1)
    # The sequences of one optimizer step: `micro_batches` micro-batches of `batch` each.
    data = torch.randint(4, config.vocab_size, (batch * micro_batches, seq_len + 1), device=device)
    first_micro_batch = data[:batch]
    step_tokens = batch * micro_batches * seq_len
    flops = flops_per_token(config, seq_len) * step_tokens
    results: list[dict] = []
    vocab = f", vocab {vocab_size}" if vocab_size else ""
    label = f"{name} x{config.num_layers} layers{vocab}, {batch}x{seq_len} tokens"
    if micro_batches > 1:
        label += f" x {micro_batches} micro-batches per optimizer step"

    # For the document-masked rows: attention within each record (FlexAttention block mask), their
    # FLOPs counting only the query-key pairs the records keep.
    documents = packed_records(batch, seq_len).to(device)
    masked_flops = flops_per_token(config, seq_len, attended_fraction(documents)) * step_tokens

    def loss_of(model: torch.nn.Module, hf: bool, masked: bool = False, batch: torch.Tensor = first_micro_batch,
                recipe: str = "bf16") -> torch.Tensor:
        """recipe: the moe.precision the foldmill model trains in (bf16, or bf16-mixed under autocast)."""
        if hf:
            return model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        with autocast(device, recipe):
            logits = model(batch[:, :-1], documents if masked else None).logits
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())

    def train_step_fn(model: torch.nn.Module, hf: bool, masked: bool, graphed: bool,
                      torch_optimizer: bool, recipe: str = "bf16", masters: dict | None = None,
                      stream: torch.cuda.Stream | None = None) -> Callable[[], None]:
        """One training step: HF rows (and torch_optimizer) clip with torch and step torch's fused AdamW;
        foldmill rows clip inside foldmill's AdamW update, as the trainer does (`masters`: the
        float32 masters of weights stored in bf16, train/precision.py; `stream`: a DDP model's, from
        built_on_capture_stream)."""
        if hf or torch_optimizer:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

            def update() -> None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
        else:
            optimizer = AdamW(model.parameters(), lr=1e-4, fused=True, master_weights=masters)

            def update() -> None:
                optimizer.step(grad_scale=clip_factor(model, 1.0)[1])

        def losses(batch: torch.Tensor) -> tuple[torch.Tensor]:
            return (loss_of(model, hf, masked, batch, recipe),)

        if graphed:  # what the trainer does with moe.cuda_graphs
            captured = CapturedForwardBackward(model, losses, micro_batches, stream)

            def graphed_step() -> None:
                captured(data)
                update()

            return graphed_step

        def step() -> None:
            accumulate_gradients(losses, data, micro_batches)
            update()
            optimizer.zero_grad(set_to_none=True)

        return step

    def activation_gib(model: torch.nn.Module, hf: bool, masked: bool, recipe: str) -> float:
        """Memory the forward pass keeps for the backward (allocated after the loss minus before)."""
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        loss = loss_of(model, hf, masked, recipe=recipe)
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated() - before
        loss.backward()
        model.zero_grad(set_to_none=True)
        return round(kept / 2**30, 2)

    def row(variant: str, build: Callable[[], Built], precision: str, masked: bool = False, graphed: bool = False,
            torch_optimizer: bool = False, recipe: str = "bf16") -> None:
        def measure() -> dict:
            model, hf, masters = build()
            # Not kept: a captured step's graph memory would stay through activation_gib's eager pass.
            ms = cuda_median_ms(train_step_fn(model, hf, masked, graphed, torch_optimizer, recipe, masters), repeats,
                                warmup=3)
            rate = step_tokens / ms * 1e3
            work = masked_flops if masked else flops
            return {"ms": round(ms, 2), "tokens_per_s": round(rate), "tflops": round(work / ms / 1e9, 1),
                    "activation_gib": activation_gib(model, hf, masked, recipe)}

        result = {"section": "step", "shape": label, "variant": variant}
        _guarded(results, result, measure)
        add_mfu(result, precision, peaks)

    def hf_model(implementation: str) -> Callable[[], Built]:
        def build() -> Built:
            with torch.device(device):
                hf = MixtralForCausalLM(_hf_config(config, config.num_layers, implementation)).to(torch.bfloat16)
            return hf, True, {}

        return build

    def foldmill_model(backend: str, compiled: bool = False, recipe: str = "bf16",
                       **settings: object) -> Callable[[], Built]:
        """`settings`: ModelConfig fields that differ from the step model's (e.g. recompute_experts);
        the parameters stored as the trainer stores them for `recipe` (train/precision.py)."""

        def build() -> Built:
            with torch.device(device):
                model_config = dataclasses.replace(config, expert_backend=backend, **settings)
                model = MoEDecoder(model_config)
            masters = prepare_parameters(model, recipe)
            return (compile_dense_blocks(model) if compiled else model), False, masters

        return build

    def profile_rows(backend: str, recipe: str = "bf16") -> None:
        def measure() -> dict:
            model, hf, masters = foldmill_model(backend, recipe=recipe)()
            kernels = kernel_times(train_step_fn(model, hf, masked=False, graphed=True, torch_optimizer=False,
                                                 recipe=recipe, masters=masters))
            by_category = ms_by_category(kernels)
            # The kernels go to moe_bench.json only (the markdown table keeps its columns).
            return {"ms": round(by_category.pop("all kernels"), 2), "by_category": by_category, "kernels": kernels}

        variant = f"foldmill {backend}, CUDA graph" + (f", {recipe}" if recipe != "bf16" else "")
        row = {"section": "profile", "shape": label, "variant": f"{variant}: all kernels"}
        _guarded(results, row, measure)
        for category, ms in row.pop("by_category", {}).items():
            results.append({"section": "profile", "shape": label, "variant": f"{variant}: {category}",
                            "ms": round(ms, 2)})

    def host_row(backend: str, ddp: bool = False, graphed: bool = False) -> None:
        """`ddp`: the model under DDP over a process group of this process alone (DDP's gradient
        hooks, bucket copies and all-reduces, as each process of a data-parallel run pays them),
        `graphed`: its step captured as the trainer captures it."""
        def measure() -> dict:
            if not ddp:
                return measure_step(*foldmill_model(backend)())
            with one_process_group(this_gpu):
                model, hf, masters = foldmill_model(backend)()
                model, stream = built_on_capture_stream(lambda: wrap_model(model, "ddp", Dist(0, 1, this_gpu)),
                                                        this_gpu)
                return measure_step(model, hf, masters, stream)

        def measure_step(model: torch.nn.Module, hf: bool, masters: dict,
                         stream: torch.cuda.Stream | None = None) -> dict:
            step = train_step_fn(model, hf, masked=False, graphed=graphed, torch_optimizer=False, masters=masters,
                                 stream=stream)
            ms = cuda_median_ms(step, repeats, warmup=3)  # the warm-up for every count below
            measured = {"ms": round(ms, 2), "host_ms": round(host_median_ms(step, repeats, warmup=0), 2)}
            if not graphed:  # a replay launches no kernel from Python
                kernels = kernel_times(step, steps=1, warmup=0)
                measured.update(kernels_per_step=round(sum(kernel["launches_per_step"] for kernel in kernels)),
                                triton_kernels_per_step=triton_launches(step))
            return measured

        # Named as the step section's rows, so speedup_vs_foldmill_grouped compares them.
        variant = f"foldmill {backend}" + (", DDP over one process" if ddp else "")
        variant += ", CUDA graph" if graphed else ""
        _guarded(results, {"section": "host", "shape": label, "variant": variant}, measure)

    def flash_attention_4_rows() -> None:
        """The captured bf16 step with FlashAttention 4's attention (ModelConfig.attention), where installed."""
        if not flash_attention_4_installed():
            return
        flash = foldmill_model("grouped", attention="flash_attn_4")
        row("foldmill grouped, CUDA graph, attention flash_attn_4", flash, "bf16", graphed=True)
        row("foldmill grouped, document-masked, CUDA graph, attention flash_attn_4", flash, "bf16", masked=True,
            graphed=True)

    if profile:
        for backend in backends:
            profile_rows(backend)
        for backend in backends:
            profile_rows(backend, recipe="bf16-mixed")
        return results
    if host:
        for backend in backends:
            host_row(backend)
        for backend in backends:
            host_row(backend, ddp=True)
            host_row(backend, ddp=True, graphed=True)
        add_speedups(results)
        return results
    for implementation in ("grouped_mm",) if captured_only else ("eager", "grouped_mm"):
        row(f"HF {implementation}", hf_model(implementation), "bf16")
    for backend in [] if captured_only else backends:
        row(f"foldmill {backend}", foldmill_model(backend), GEMM_PRECISION[backend])
    for backend in backends:
        row(f"foldmill {backend}, CUDA graph (moe.cuda_graphs)", foldmill_model(backend), GEMM_PRECISION[backend],
            graphed=True)
    if "mxfp8" in backends:
        row("foldmill mxfp8, CUDA graph, SwiGLU input stored in MXFP8 (moe.mxfp8_store_swiglu_input)",
            foldmill_model("mxfp8", mxfp8_store_swiglu_input=True), "fp8", graphed=True)
    for backend in EIGHT_BIT_BACKENDS:
        if backend in backends:
            row(f"foldmill {backend}, CUDA graph, weight copies per GEMM (moe.keep_weight_copies: false)",
                foldmill_model(backend, keep_weight_copies=False), GEMM_PRECISION[backend], graphed=True)
    if "mxfp8" in backends:  # both memory options, as a run that must fit a smaller GPU sets them
        row("foldmill mxfp8, CUDA graph, SwiGLU input stored in MXFP8, weight copies per GEMM",
            foldmill_model("mxfp8", mxfp8_store_swiglu_input=True, keep_weight_copies=False), "fp8", graphed=True)
    if captured_only:
        if "grouped" in backends:
            row("foldmill grouped, document-masked, CUDA graph", foldmill_model("grouped"), "bf16", masked=True,
                graphed=True)
            flash_attention_4_rows()
        add_speedups(results)
        return results
    for backend in backends:  # the trainer's default recipe
        row(f"foldmill {backend}, CUDA graph, bf16-mixed (moe.precision default: float32 masters and AdamW states)",
            foldmill_model(backend, recipe="bf16-mixed"), GEMM_PRECISION[backend], graphed=True, recipe="bf16-mixed")
    for backend in backends:
        row(f"foldmill {backend}, CUDA graph, experts recomputed (moe.recompute_experts)",
            foldmill_model(backend, recompute_experts=True), GEMM_PRECISION[backend], graphed=True)
    if "fp8_rowwise" in backends:
        row("foldmill fp8_rowwise, CUDA graph, promoted accumulation (moe.fp8_fast_accumulation: false)",
            foldmill_model("fp8_rowwise", fp8_fast_accumulation=False), "fp8", graphed=True)
    if "grouped" in backends:
        row("foldmill grouped, CUDA graph, torch's clipping + fused AdamW", foldmill_model("grouped"), "bf16",
            graphed=True, torch_optimizer=True)
        row("foldmill grouped, dense blocks compiled (moe.compile)", foldmill_model("grouped", compiled=True), "bf16")
        row("foldmill grouped, document-masked (records of 50-800 tokens)", foldmill_model("grouped"), "bf16",
            masked=True)
        row("foldmill grouped, document-masked, CUDA graph", foldmill_model("grouped"), "bf16", masked=True,
            graphed=True)
        flash_attention_4_rows()
    if "quack" in backends:  # QuACK's experts with the fastest attention for each mask: the fastest bf16 steps
        row("foldmill quack, document-masked, CUDA graph", foldmill_model("quack"), "bf16", masked=True, graphed=True)
        if flash_attention_4_installed():
            row("foldmill quack, CUDA graph, attention flash_attn_4",
                foldmill_model("quack", attention="flash_attn_4"), "bf16", graphed=True)
    add_speedups(results)
    return results


# ---------------------------------------------------------------- attention


def bench_attention(name: str, tokens: int, seq_len: int, repeats: int, peaks: dict[str, float]) -> list[dict]:
    """Each case of _attention.attention_cases, forward and backward to q, k and v at the step
    model's attention shape: timed in a CUDA graph (as the captured step runs it) and launched from
    Python, with the output's and the gradients' error against float32 attention over the same mask."""
    from foldmill.bench._attention import attention_cases, attention_flops, attention_inputs

    config = model_config(name)
    batch = max(tokens // seq_len, 1)
    inputs = attention_inputs(config, batch, seq_len, torch.device("cuda"))
    shape = (f"{name} attention: {batch}x{seq_len} tokens, {config.num_heads} query and {config.num_kv_heads} "
             f"key-value heads of {config.head_dim}")
    cases = attention_cases(inputs.documents)
    results: list[dict] = []
    for within_records in (False, True):
        flops = attention_flops(inputs.mask_ids(within_records), config.num_heads, config.head_dim)
        reference = inputs.reference(within_records)
        for case in (case for case in cases if case.within_records == within_records):
            run = functools.partial(inputs.forward_backward, case)
            errors = functools.partial(_attention_errors, run, reference)  # once per case, with its graphed row
            for how, time_ms, check in (("CUDA graph", cuda_graph_median_ms, errors),
                                        ("launched from Python", functools.partial(cuda_median_ms, repeats=repeats),
                                         None)):
                row = {"section": "attention", "shape": shape, "variant": f"{case.variant}, {how}"}
                _guarded(results, row, functools.partial(_timed_attention, run, time_ms, flops, check))
                add_mfu(row, "bf16", peaks)
    return results


def _timed_attention(run: Callable[[], tuple], time_ms: Callable[[Callable[[], object]], float], flops: float,
                     check: Callable[[], dict] | None) -> dict:
    checked = check() if check is not None else {}
    torch.cuda.reset_peak_memory_stats()  # the row's peak is its timed calls', not the check's
    ms = time_ms(run)
    return {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1), **checked}


def _attention_errors(run: Callable[[], tuple], want: tuple) -> dict:
    """run()'s output's relative error, and its gradients' (q, k and v together), against float32."""
    (out, grads), (out_ref, grads_ref) = run(), want
    flat = torch.cat([g.flatten() for g in grads])
    flat_ref = torch.cat([g.flatten() for g in grads_ref])
    return {"rel_error_vs_fp32": _relative_error(out.detach(), out_ref),
            "rel_grad_error_vs_fp32": _relative_error(flat, flat_ref)}


# ---------------------------------------------------------------- kernels


def bench_kernels(name: str, tokens: int) -> list[dict]:
    """Each kernel of _moe_kernels.kernel_cases, timed in a CUDA graph, with the rate of bytes it moves."""
    config = model_config(name)
    return _graphed_rows("kernels", kernel_shape(name, config, tokens), kernel_cases(config, tokens),
                         lambda case, ms: {"gb_per_s": round(case.bytes_moved / ms / 1e6, 1)})


def bench_quack_tiles(name: str, tokens: int) -> list[dict]:
    """Each case of _quack_tiles.tile_cases, timed in a CUDA graph (as the captured step runs it)."""
    from foldmill.bench._quack_tiles import tile_cases

    config = model_config(name)
    return _graphed_rows("quack-tiles", kernel_shape(name, config, tokens), tile_cases(config, tokens),
                         lambda case, ms: {"tflops": round(case.flops / ms / 1e9, 1)})


def _graphed_rows(section: str, shape: str, cases: list, rate: Callable[[object, float], dict]) -> list[dict]:
    """One row per case (`variant`, `run`): milliseconds per call in a CUDA graph, and rate(case, ms)."""
    results: list[dict] = []
    for case in cases:
        def measure(case=case) -> dict:
            ms = cuda_graph_median_ms(case.run)
            return {"ms": round(ms, 4), **rate(case, ms)}

        _guarded(results, {"section": section, "shape": shape, "variant": case.variant}, measure)
    return results


# ---------------------------------------------------------------- report


def markdown_table(rows: list[dict]) -> str:
    columns = ["section", "shape", "variant", "ms", "tokens_per_s", "tflops", "gb_per_s", "precision", "mfu_spec", "mfu_bf16_spec",
               "mfu_measured", "speedup_vs_eager", "speedup_vs_grouped_mm", "speedup_vs_foldmill_grouped",
               "activation_gib", "peak_memory_gib", "host_ms", "kernels_per_step", "triton_kernels_per_step",
               "rel_error_vs_fp32", "rel_grad_error_vs_fp32", "rel_diff_vs_hf_eager", "error"]
    used = [c for c in columns if any(c in r for r in rows)]
    lines = ["| " + " | ".join(used) + " |", "|" + "---|" * len(used)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in used) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def report_header(device_name: str, peaks: dict[str, float], contenders: dict[str, str]) -> str:
    measured = ", ".join(f"{k} {v}" for k, v in peaks.items())
    spec = ", ".join(f"{k} {v:g}" for k, v in spec_peaks(device_name).items()) or "not known for this GPU"
    libraries = ", ".join(f"{k}: {v}" for k, v in contenders.items())
    return (f"Device: {device_name}, torch {torch.__version__}\n\n"
            f"Peaks (TFLOP/s): spec dense {spec}; measured 8192^3 GEMM {measured}. mfu_spec and mfu_measured hold "
            f"each row against its own precision's peak (8-bit rows against FP8), mfu_bf16_spec every row against "
            f"the bf16 spec peak.\n\nOptional libraries: {libraries}\n\n")


SECTIONS = ("gemm", "layer", "step", "attention", "profile", "host", "kernels", "quack-tiles")


def parse_sections(text: str) -> set[str]:
    """--sections as a set; a misspelt name is an error, not a run that measures nothing."""
    sections = {name for name in text.split(",") if name}
    unknown = sorted(sections - set(SECTIONS))
    if unknown or not sections:
        problem = f"unknown {', '.join(unknown)}" if unknown else "no section named"
        raise FoldmillError(f"--sections {text!r}: {problem}; choose from {', '.join(SECTIONS)}")
    return sections


def default_backends() -> list[str]:
    """grouped, fp8_rowwise, mxfp8, and quack where its library is installed."""
    return ["grouped", "fp8_rowwise", "mxfp8"] + (["quack"] if quack_installed() else [])


def run(args: argparse.Namespace) -> int:
    sections = parse_sections(args.sections)
    for name in filter(None, (*args.layer_shapes.split(","), args.step_model, args.wide_step_model)):
        model_config(name)  # a misspelt config stops the bench before any GPU work
    if "kernels" in sections:
        for name in filter(None, (args.step_model, args.wide_step_model)):
            check_kernel_tokens(name, model_config(name), args.tokens)
    if "quack-tiles" in sections and not quack_installed():
        raise FoldmillError("--sections quack-tiles needs QuACK: pip install quack-kernels")
    if not torch.cuda.is_available():
        raise FoldmillError("foldmill bench moe needs a CUDA GPU")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    backends = default_backends() if args.backends is None else [b for b in args.backends.split(",") if b]
    rows: list[dict] = []
    device_name = torch.cuda.get_device_name()
    peaks = measure_peaks(args.repeats)
    contenders = available_contenders()
    print(json.dumps({"measured_peak_tflops": peaks, "contenders": contenders}), flush=True)

    def save() -> None:
        payload = {"device": device_name, "torch": torch.__version__, "measured_peak_tflops": peaks,
                   "spec_peak_tflops": spec_peaks(device_name), "contenders": contenders, "rows": rows}
        write_text_atomic(out / "moe_bench.json", json.dumps(payload, indent=2) + "\n")
        write_text_atomic(out / "moe_bench.md", report_header(device_name, peaks, contenders) + markdown_table(rows))

    if "gemm" in sections:
        rows += bench_gemm(backends, args.repeats, peaks)
        save()
    gemm_rows = len(rows)
    if "layer" in sections:
        for shape in args.layer_shapes.split(","):
            rows += bench_layer(shape, args.tokens, backends, args.repeats, peaks)
            save()
    if "step" in sections:
        rows += bench_step(args.step_model, args.step_layers, args.tokens, args.seq_len, backends, args.repeats, peaks)
        save()
        if args.large_step_tokens:
            rows += bench_step(args.step_model, args.step_layers, args.large_step_tokens, args.seq_len, backends,
                               args.repeats, peaks, captured_only=True)
            save()
        if args.micro_batches > 1:
            rows += bench_step(args.step_model, args.step_layers, args.tokens, args.seq_len, backends, args.repeats,
                               peaks, captured_only=True, micro_batches=args.micro_batches)
            save()
        if args.wide_step_model:
            # With the step model's vocabulary: a sequence model with wider experts, not a language model.
            vocab_size = model_config(args.step_model).vocab_size
            for tokens in filter(None, (args.tokens, args.large_step_tokens)):
                rows += bench_step(args.wide_step_model, args.wide_step_layers, tokens, args.seq_len, backends,
                                   args.repeats, peaks, captured_only=True, vocab_size=vocab_size)
                save()
    if "attention" in sections:
        rows += bench_attention(args.step_model, args.tokens, args.seq_len, args.repeats, peaks)
        save()
    if "profile" in sections:
        rows += bench_step(args.step_model, args.step_layers, args.tokens, args.seq_len, backends, args.repeats, peaks,
                           profile=True)
        save()
    if "host" in sections:
        rows += bench_step(args.step_model, args.step_layers, args.tokens, args.seq_len, backends, args.repeats, peaks,
                           host=True)
        save()
    if "kernels" in sections:
        for name in filter(None, (args.step_model, args.wide_step_model)):
            rows += bench_kernels(name, args.tokens)
            save()
    if "quack-tiles" in sections:
        for name in filter(None, (args.step_model, args.wide_step_model)):
            rows += bench_quack_tiles(name, args.tokens)
            save()
    if "gemm" in sections and any(importlib.util.find_spec(name) for name in IMPORTED_LAST):
        # Last, and listed with the other gemm rows (IMPORTED_LAST).
        rows[gemm_rows:gemm_rows] = bench_gemm(backends, args.repeats, peaks, imported_last=True)
        save()
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    from foldmill.bench._standalone import main

    raise SystemExit(main(register))
