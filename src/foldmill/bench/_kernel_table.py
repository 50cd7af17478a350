"""Measure a crossover table on this GPU: every backend of every routed op, at Boltz-2's shapes, in bf16.

Shapes: triangle multiplication on a (1, N, N, 128) pair; triangle attention core with 4 heads
x 32 over all N rows (the cuEquivariance layout); pair-biased attention as the diffusion score
model runs it (5 samples, 16 heads x 48, one bias) over N tokens; the pair transition
(128 -> 512 -> 128) on the fp32 (1, N, N, 128) pair (the single track's N rows of 384 are not
timed: the table is keyed by tokens); the LayerNorm of that fp32 pair to the compute dtype. Each
backend runs through `kernels.dispatch` with the backend forced, so what is timed is what the
model runs. Median of `repeats` CUDA-event timings after warm-up.
Also records each backend's relative error against the fp32 reference on the same inputs.
`foldmill bench kernels` writes the result as crossover_<arch>.json; point
FOLDMILL_CROSSOVER_DIR at its directory to use it, or copy it into foldmill/kernels/.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from foldmill import kernels
from foldmill.kernels.crossover import table_from_timings
from foldmill.model.layers.transition import Transition
from foldmill.model.layers.triangle_multiplication import TriangleMultiplicationOutgoing
from foldmill.runtime.timing import cuda_median_ms

SIZES = (128, 256, 384, 512, 768, 1024)
# A backend this far from the fp32 reference (bf16 rounding gives ~5e-3) is not put in the table.
MAX_RELATIVE_ERROR = 2e-2


def relative_error(value: Tensor, reference: Tensor) -> float:
    return float((value.double() - reference.double()).norm() / reference.double().norm().clamp(min=1e-30))


def _cases(num_tokens: int, device: torch.device) -> dict[str, tuple[Callable[[], Tensor], Callable[[], Tensor]]]:
    """op -> (run in bf16 through the registry, fp32 reference on the same inputs)."""
    n, bf16 = num_tokens, torch.bfloat16
    generator = torch.Generator(device=device).manual_seed(num_tokens)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator, device=device)

    trimul = TriangleMultiplicationOutgoing(128).to(device).eval()
    for parameter in trimul.parameters():
        parameter.data = randn(*parameter.shape) / (parameter.shape[-1] ** 0.5 if parameter.dim() > 1 else 1)
    pair, pair_mask = randn(1, n, n, 128), torch.ones(1, n, n, device=device)

    def trimul_bf16() -> Tensor:
        with torch.autocast("cuda", dtype=bf16):
            return trimul(pair.to(bf16), pair_mask)

    q, k, v = (randn(1, n, 4, n, 32) for _ in range(3))
    tri_bias, tri_mask = randn(1, 1, 4, n, n), torch.ones(1, n, 1, 1, n, dtype=torch.bool, device=device)
    scale = 1 / math.sqrt(32)

    def tri_attention(dtype: torch.dtype) -> Callable[[], Tensor]:
        args = (q.to(dtype), k.to(dtype), v.to(dtype), tri_bias.to(dtype), tri_mask, scale)
        return lambda: kernels.dispatch("triangle_attention", *args)

    # The score model's token attention (5 samples, 16 heads x 48, one bias shared by the samples): it
    # makes ~95% of this op's calls in a forward (200 steps x 24 layers against the trunk's 4 x 64).
    sq, sk, sv = (randn(5, n, 16, 48) for _ in range(3))
    s_bias, s_mask = randn(1, 16, n, n).expand(5, -1, -1, -1), torch.ones(5, n, device=device)

    def pair_bias_attention(dtype: torch.dtype) -> Callable[[], Tensor]:
        args = (sq.to(dtype), sk.to(dtype), sv.to(dtype), s_bias.to(dtype), s_mask, 1e6)
        return lambda: kernels.dispatch("attention_pair_bias", *args)

    transition = Transition(128, 512).to(device).eval().requires_grad_(False)  # inference, as in the model
    for parameter in transition.parameters():
        parameter.data = randn(*parameter.shape) / (parameter.shape[-1] ** 0.5 if parameter.dim() > 1 else 1)

    def transition_bf16() -> Tensor:
        with torch.autocast("cuda", dtype=bf16):
            return transition(pair)

    norm_weight, norm_bias = 1 + 0.2 * randn(128), 0.2 * randn(128)

    def layer_norm() -> Tensor:  # fp32 pair in; under autocast the compute dtype out
        return kernels.dispatch("layer_norm", pair, norm_weight, norm_bias, 1e-5)

    def reference(fn: Callable[[], Tensor]) -> Callable[[], Tensor]:
        def run() -> Tensor:
            with kernels.kernel_policy(enabled=False):
                return fn()

        return run

    return {
        "triangle_multiplication": (trimul_bf16, reference(lambda: trimul(pair, pair_mask))),
        "triangle_attention": (tri_attention(bf16), reference(tri_attention(torch.float32))),
        "attention_pair_bias": (pair_bias_attention(bf16), reference(pair_bias_attention(torch.float32))),
        "transition": (transition_bf16, reference(lambda: transition(pair))),
        "layer_norm": (layer_norm, reference(layer_norm)),
    }


def measure(sizes: tuple[int, ...] = SIZES, repeats: int = 10, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time every backend per op and size; returns the crossover table (see foldmill.kernels.crossover)."""
    device = torch.device("cuda")
    major, minor = torch.cuda.get_device_capability(device)
    timings: dict[str, dict[str, dict[str, float]]] = {}
    errors: dict[str, dict[str, dict[str, float]]] = {}
    for n in sizes:
        for op, (run_bf16, run_reference) in _cases(n, device).items():
            expected = run_reference()
            for backend in kernels.backend_names(op):
                with kernels.kernel_policy(force={op: backend}):
                    try:
                        if kernels.select(op, torch.empty(0, device=device, dtype=torch.bfloat16), n) != backend:
                            continue  # not available here
                        # Timed under autocast too: the layer norm picks its backend by the compute dtype
                        # (outside autocast an fp32 input selects the reference, whatever is forced).
                        with torch.autocast("cuda", dtype=torch.bfloat16):
                            out = run_bf16()
                            milliseconds = cuda_median_ms(run_bf16, repeats, warmup=2)
                    except torch.OutOfMemoryError:
                        torch.cuda.empty_cache()
                        log(f"{op} {backend} N={n}: out of memory")
                        continue
                error = relative_error(out, expected)
                errors.setdefault(op, {}).setdefault(backend, {})[str(n)] = error
                log(f"{op:24s} {backend:10s} N={n:5d} {milliseconds:9.3f} ms  rel.err {error:.2e}")
                if backend != "reference" and not error <= MAX_RELATIVE_ERROR:  # NaN fails too
                    log(f"{op} {backend} N={n}: relative error {error:.2e} > {MAX_RELATIVE_ERROR}, left out")
                    continue
                timings.setdefault(op, {}).setdefault(backend, {})[str(n)] = round(milliseconds, 4)
            del expected
        torch.cuda.empty_cache()
    ops = {op: {"bfloat16": table_from_timings(per_backend)} for op, per_backend in timings.items()}
    for per_dtype in ops.values():
        for row in per_dtype["bfloat16"]:
            row["order"] += [name for name in ("reference",) if name not in row["order"]]
    return {
        "arch": f"sm_{major}{minor}",
        "device": torch.cuda.get_device_name(device),
        "measured": f"{datetime.date.today()}, torch {torch.__version__}, repeats {repeats} (median)",
        "ops": ops,
        "timings_ms": {op: {"bfloat16": per_backend} for op, per_backend in timings.items()},
        "relative_error_vs_fp32_reference": errors,
    }
