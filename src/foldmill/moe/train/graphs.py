"""The forward and backward passes of a training step captured as one CUDA graph (moe.cuda_graphs).

At bio_8x1b size a step launches about 2,000 kernels; the 8-bit backends add a few hundred small
Triton kernels whose Python launch takes longer than their GPU time, so the GPU waits on the CPU
(launched from Python, the bio_8x1b FP8 step took 122.1 ms on one H200 machine and 159.9 ms on
another, whose host was slower; captured, 114.5). A replayed graph launches them all at once.

What a replay needs, and this code provides:
- static shapes and no host synchronization: the routing buffer has a fixed size
  (moe.experts.routing), the document mask is built on the device;
- static inputs: each batch is copied into the buffer the graph reads;
- gradients that stay the same tensors between replays: the graph's backward writes them, so the
  caller must not set them to None (zero_grad(set_to_none=True) would detach them);
- 8-bit weight copies remade on every replay: the copy caches are invalidated before capture, so
  the graph records the copies, and after every replay, so eager code (evaluation) never reads a
  copy of older weights.
- gradient accumulation inside the graph: a step of several micro-batches runs their passes one
  after the other in one graph, so the 8-bit weight copies are made once per optimizer step.
- a model under DDP: the graph holds DDP's gradient reduction too (NCCL collectives can be
  captured), so a process replays its step as one launch. As torch's CUDA-graph notes ask, DDP is
  built on the stream that warms up and captures (its gradient hooks run on that stream) and runs
  11 eager iterations first (it times its first 10 with host synchronization). Captured
  collectives need every process to capture the same passes at the same step; the trainer
  captures DDP steps over a process group of one process only (distributed.step_can_be_captured).
Clipping and the optimizer stay eager: a norm and one update kernel per parameter (train/optim.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from foldmill.moe.experts.weights import invalidate_weight_copies
from foldmill.moe.train.distributed import deferred_gradient_sync
from foldmill.moe.train.loss import accumulate_gradients

# Warm-up passes before capture: kernels compile and autotune, the allocator settles. DDP must also
# be past the iterations it times.
WARMUP_PASSES = 2
DDP_WARMUP_PASSES = 11


def built_on_capture_stream(build: Callable[[], nn.Module],
                            device: torch.device) -> tuple[nn.Module, torch.cuda.Stream | None]:
    """build() (wrap_model) on a new stream; returns the model, and the stream if the model is under
    DDP (else None), for CapturedForwardBackward to warm up and capture on: DDP's gradient hooks run
    on the stream DDP was built on. The current stream then waits for it."""
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        model = build()
    torch.cuda.current_stream(device).wait_stream(stream)
    return model, stream if isinstance(model, nn.parallel.DistributedDataParallel) else None


class CapturedForwardBackward:
    """loss_fn(batch) -> (loss, *metrics) of `model`; calling this with a step's batch runs the
    forward and backward passes of its `micro_batches` equal parts (train/loss.accumulate_gradients)
    by replaying one CUDA graph (captured at the first call) and returns (loss, *metrics) averaged
    over the parts. Gradients land in the parameters' .grad, as after eager backward passes.

    Under DDP, warm-up and capture run on `stream`, the one built_on_capture_stream gave."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[torch.Tensor], Sequence[torch.Tensor]],
                 micro_batches: int = 1, stream: torch.cuda.Stream | None = None) -> None:
        ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        if ddp and stream is None:
            raise ValueError("a DDP model's step is captured on the stream DDP was built on (built_on_capture_stream)")
        self.loss_fn = loss_fn
        self.parameters = list(model.parameters())
        self.micro_batches = micro_batches
        self.defer_sync = deferred_gradient_sync(model)
        self.stream = stream
        self.passes = DDP_WARMUP_PASSES if ddp else WARMUP_PASSES
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_batch: torch.Tensor | None = None
        self.outputs: Sequence[torch.Tensor] = ()

    def __call__(self, batch: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.graph is None:
            self._capture(batch)
        elif batch.shape != self.static_batch.shape:
            raise ValueError(f"a captured step takes batches of shape {tuple(self.static_batch.shape)}, "
                             f"not {tuple(batch.shape)}")
        self.static_batch.copy_(batch, non_blocking=True)
        self.graph.replay()
        invalidate_weight_copies()
        return tuple(output.clone() for output in self.outputs)

    def _capture(self, batch: torch.Tensor) -> None:
        self.static_batch = batch.clone()
        for parameter in self.parameters:
            parameter.grad = None
        # Warm up on a side stream, as capture requires; under DDP capture on it too (its hooks run
        # there). These passes change no parameter.
        side = self.stream or torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.passes):
                accumulate_gradients(self.loss_fn, self.static_batch, self.micro_batches, self.defer_sync)
                for parameter in self.parameters:
                    parameter.grad = None
        torch.cuda.current_stream().wait_stream(side)
        invalidate_weight_copies()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):  # None: torch's capture stream
            outputs = accumulate_gradients(self.loss_fn, self.static_batch, self.micro_batches, self.defer_sync)
        self.graph, self.outputs = graph, outputs
