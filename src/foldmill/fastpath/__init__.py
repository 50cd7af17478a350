"""The GPU fast path: a Boltz2's weights run in bf16 with foldmill's kernels, token padding, CUDA graphs
and a device-only sampler (runner: `FastBoltz2`; the passes over the model: foldmill.fastpath.prepare)."""

from foldmill.fastpath.runner import FastBoltz2, FastPathOptions

__all__ = ["FastBoltz2", "FastPathOptions"]
