"""Shared by the kernel tests: whether triton is importable, the relative error, and running
a test file's cases under Triton's CPU interpreter.

The interpreter needs TRITON_INTERPRET=1 before triton is imported, which would turn every Triton
kernel of the test process into its interpreted form, so the kernel runs in a child process: the
test file run as a script (its `__main__` calls its own `_run_cases(cases, outputs)`) on inputs the
test writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


def patch_interpreter_for_numpy_2_4() -> None:
    """Triton 3.6's interpreter turns loop bounds read from kernel arguments into int(1-element array),
    which numpy >= 2.4 refuses (triton-lang/triton#9171, fixed upstream): convert the element instead."""
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
