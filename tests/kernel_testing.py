"""Shared by the kernel tests: whether triton is importable, the relative error, and running
a test file's cases under Triton's CPU interpreter.

The interpreter needs TRITON_INTERPRET=1 before triton is imported, which would turn every Triton
kernel of the test process into its interpreted form, so the kernel runs in a child process: the
test file run as a script (its `__main__` calls `serve_cases(its _run_case)`) on inputs the test writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

try:
    import triton  # noqa: F401 - the interpreted kernels are imported in the child process only

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value.double() - reference.double()).norm() / reference.double().norm())


def rms_norm_fp64(h: torch.Tensor, weight: torch.Tensor, grad_y: torch.Tensor,
                  eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y = rmsnorm(h) * weight in fp64, and the fp64 gradients of h and weight for the output gradient grad_y."""
    h64 = h.detach().double().requires_grad_()
    weight64 = weight.detach().double().requires_grad_()
    y64 = h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + eps) * weight64
    y64.backward(grad_y.double())
    return y64.detach(), h64.grad, weight64.grad


def run_interpreted(test_file: str, cases: list[dict[str, Any]], directory: Path, timeout: int = 600) -> dict[str, Any]:
    """Save `cases`, run `test_file` as a script under the interpreter, return the outputs it saved."""
    cases_path, outputs_path = directory / "cases.pt", directory / "outputs.pt"
    torch.save(cases, cases_path)
    result = subprocess.run(
        [sys.executable, test_file, str(cases_path), str(outputs_path)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(outputs_path, weights_only=True)


def case_dtype(case: dict[str, Any]) -> torch.dtype:
    """A case's compute dtype, saved by name ("torch.bfloat16")."""
    return getattr(torch, case["dtype"].removeprefix("torch."))


def serve_cases(run_case: Callable[[dict[str, Any], torch.dtype], Any], patch_numpy: bool = False) -> None:
    """The child process of `run_interpreted` (a test file's `__main__`, TRITON_INTERPRET=1): runs
    `run_case(case, its dtype)` on every case saved at sys.argv[1] and saves the outputs, by case name, at
    sys.argv[2]. `patch_numpy`: patch_interpreter_for_numpy_2_4 first."""
    if patch_numpy:
        patch_interpreter_for_numpy_2_4()
    outputs = {case["name"]: run_case(case, case_dtype(case)) for case in torch.load(sys.argv[1], weights_only=True)}
    torch.save(outputs, sys.argv[2])


def through_backend(op: str, dtype: torch.dtype, *args: Any, autocast: bool = True, **kwargs: Any) -> Any:
    """The op's Triton backend as the registry runs it (its reference where it does not apply), under CPU
    autocast to `dtype` and without autograd."""
    from foldmill import kernels

    with torch.autocast("cpu", dtype=dtype, enabled=autocast), torch.no_grad():
        return kernels.call_backend(op, "triton", *args, **kwargs)


def patch_interpreter_for_numpy_2_4() -> None:
    """Triton 3.6's interpreter turns loop bounds read from kernel arguments into int(1-element array),
    which numpy >= 2.4 refuses (triton-lang/triton#9171, fixed upstream): convert the element instead."""
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


BF16_TOL, FP32_TOL = 1e-2, 1e-5
H100_SHARED_MEMORY_BYTES = 227 * 1024  # per block, opt-in maximum on sm_90


def sm90_compiled(
    kernel: Any,
    signature: dict[str, str],
    constants: dict[str, Any],
    num_warps: int,
    num_stages: int,
    max_registers: int | None = None,
    divisible_by_16: Iterable[str] = (),
    capability: int = 90,
) -> Any:
    """A Triton kernel compiled for sm_90 (or `capability`, e.g. 100 for Blackwell) ahead of time, no
    GPU needed; `divisible_by_16` names the arguments (pointers, strides) specialised as
    16-divisible, as Triton does at run time."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    options: dict[str, Any] = {"num_warps": num_warps, "num_stages": num_stages}
    if max_registers is not None:
        options["maxnreg"] = max_registers
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible_by_16}
    return triton.compile(
        ASTSource(kernel, {**signature, **dict.fromkeys(constants, "constexpr")}, constants, attrs),
        target=GPUTarget("cuda", capability, 32),
        options=options,
    )


def sm90_shared_memory(
    kernel: Any, signature: dict[str, str], constants: dict[str, Any], num_warps: int, num_stages: int
) -> int:
    """Compile a Triton kernel for sm_90 ahead of time (no GPU needed); its shared memory in bytes."""
    return sm90_compiled(kernel, signature, constants, num_warps, num_stages).metadata.shared


def local_memory_instructions(compiled: Any, directory: Path) -> int | None:
    """Local loads and stores (LDL/STL: spilled registers) in a compiled kernel's SASS, read with Triton's
    bundled disassembler; None where the package carries none."""
    import triton

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not nvdisasm.exists():
        return None
    cubin = directory / f"{compiled.metadata.name}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert "EXIT" in sass  # the disassembly is a kernel's
    return sum(1 for line in sass.splitlines() if " LDL" in line or " STL" in line)


def assert_gpu_backend_parity(op: str, reference: Any, inputs: tuple, expected: torch.Tensor) -> None:
    """The Triton backend of `op` on the GPU against `expected`
    (float64 math): called directly on fp32 inputs, exact (FP32_TOL; the registry routes fp32 to the
    reference); through the registry under bf16 autocast, in bf16, within BF16_TOL and no worse than
    1.5x the reference's own bf16 error."""
    from foldmill import kernels

    with torch.no_grad():
        assert relative_error(kernels.call_backend(op, "triton", *inputs), expected) <= FP32_TOL
    kernels.reset_counts()
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
        with kernels.kernel_policy(force={op: "triton"}):
            out = kernels.dispatch(op, *inputs)
        reference_out = reference(*inputs)
    assert kernels.chosen_counts() == {f"{op}/triton": 1}
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    error, reference_error = relative_error(out, expected), relative_error(reference_out, expected)
    assert error <= BF16_TOL and error <= 1.5 * reference_error, (error, reference_error)
