"""Plain configuration dataclasses for the MoE model, its data and its training (torchtitan style)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from foldmill.errors import FoldmillError

# The decoder's attention kernels (model.attention): torch's SDPA (cuDNN's flash kernels on Hopper)
# and FlexAttention for packed records, or FlashAttention 4 (kernels.flash_attention_4; CUDA only).
ATTENTION_KERNELS = ("torch", "flash_attn_4")
# Expert backends that multiply 8-bit copies of their weights (moe.keep_weight_copies applies).
EIGHT_BIT_BACKENDS = ("fp8_rowwise", "mxfp8")
# Model fields that change where memory goes, not one value a step computes (tested bit for bit): a run
# may resume with another setting, e.g. to fit a GPU with less memory.
SAME_VALUES_EITHER_WAY = ("keep_weight_copies", "recompute_experts")


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int = 64
    ffn_size: int = 128  # per expert
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    num_experts: int = 4
    top_k: int = 2
    vocab_size: int = 32  # replaced by the tokenizer's size when training on a corpus
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # Switch-style load-balancing loss weight (0 turns it off).
    aux_loss_coef: float = 0.01
    expert_backend: str = "grouped"
    # Keep each expert MLP's input instead of its first GEMM's output for the backward pass, and
    # run that GEMM again there (experts.mlp): less activation memory for one more GEMM per layer.
    recompute_experts: bool = False
    # fp8_rowwise only: FP8 tensor-core accumulation without fp32 promotion (experts.fp8_rowwise).
    fp8_fast_accumulation: bool = True
    # mxfp8 only: keep the SwiGLU's input for the backward pass as its MXFP8 copy instead of in bf16
    # (experts.mxfp8): less activation memory; the SwiGLU's gradient is then taken at the values of
    # that copy.
    mxfp8_store_swiglu_input: bool = False
    # 8-bit backends (fp8_rowwise, mxfp8): keep the weights' copies from their first GEMM to the
    # optimizer step (false: make each GEMM's copy when it runs and drop it after: less peak memory,
    # one more read of each weight per pass, the same values).
    keep_weight_copies: bool = True
    attention: str = "torch"  # one of ATTENTION_KERNELS
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise FoldmillError(
                f"hidden_size {self.hidden_size} must divide by num_heads {self.num_heads}, "
                f"and num_heads by num_kv_heads {self.num_kv_heads}"
            )
        if self.attention not in ATTENTION_KERNELS:
            raise FoldmillError(f"attention must be one of {', '.join(ATTENTION_KERNELS)}, not {self.attention!r}")
        if not 1 <= self.top_k <= self.num_experts:
            raise FoldmillError(f"top_k {self.top_k} must be between 1 and num_experts {self.num_experts}")
        if self.mxfp8_store_swiglu_input and (self.expert_backend != "mxfp8" or self.recompute_experts):
            raise FoldmillError(
                "mxfp8_store_swiglu_input needs expert_backend mxfp8 and recompute_experts off (recomputing "
                f"keeps less), got expert_backend {self.expert_backend} and recompute_experts "
                f"{str(self.recompute_experts).lower()}"
            )
        if not self.keep_weight_copies and self.expert_backend not in EIGHT_BIT_BACKENDS:
            raise FoldmillError(
                f"keep_weight_copies: false needs an 8-bit expert_backend ({' or '.join(EIGHT_BIT_BACKENDS)}), "
                f"got {self.expert_backend}"
            )
        # 8-bit GEMMs block (MXFP8: 32) or align (FP8 on Hopper: 16) both expert dimensions.
        multiple = {"mxfp8": 32, "fp8_rowwise": 16}.get(self.expert_backend, 1)
        if self.hidden_size % multiple or self.ffn_size % multiple:
            raise FoldmillError(
                f"expert backend {self.expert_backend} needs hidden_size and ffn_size divisible by {multiple}, "
                f"got {self.hidden_size} and {self.ffn_size}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def active_params_per_token(self) -> int:
        """Parameters each token touches (embedding excluded): the 6N of the FLOP count."""
        attention = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        experts = self.top_k * 3 * self.hidden_size * self.ffn_size
        router = self.hidden_size * self.num_experts
        return self.num_layers * (attention + experts + router) + self.hidden_size * self.vocab_size


MODEL_CONFIGS: dict[str, ModelConfig] = {
    # CI and the demo: trains in seconds on a CPU.
    "tiny": ModelConfig(),
    # Biological 8x1B-class (NVIDIA's og2-mixtral-8x1B shape): DNA or protein, vocab from the tokenizer.
    "bio_8x1b": ModelConfig(
        hidden_size=2048, ffn_size=4096, num_layers=16, num_heads=16, num_kv_heads=8, num_experts=8, top_k=2,
        vocab_size=256, max_seq_len=4096, rope_theta=500000.0,
    ),
    # One Mixtral-8x7B decoder layer, for benchmarks.
    "mixtral_8x7b_layer": ModelConfig(
        hidden_size=4096, ffn_size=14336, num_layers=1, num_heads=32, num_kv_heads=8, num_experts=8, top_k=2,
        vocab_size=32000, max_seq_len=4096, rope_theta=1e6,
    ),
}


def model_config(name: str, **overrides: object) -> ModelConfig:
    """A named config with field overrides (e.g. expert_backend="mxfp8")."""
    if name not in MODEL_CONFIGS:
        raise FoldmillError(f"unknown model config {name!r}; choose one of {', '.join(MODEL_CONFIGS)}")
    return dataclasses.replace(MODEL_CONFIGS[name], **overrides)


@dataclass(frozen=True)
class TrainConfig:
    model: str = "tiny"
    expert_backend: str = "grouped"
    recompute_experts: bool = False  # ModelConfig.recompute_experts
    fp8_fast_accumulation: bool = True  # ModelConfig.fp8_fast_accumulation
    mxfp8_store_swiglu_input: bool = False  # ModelConfig.mxfp8_store_swiglu_input
    keep_weight_copies: bool = True  # ModelConfig.keep_weight_copies
    steps: int = 100
    batch_size: int = 8  # sequences per GPU (per process) and forward pass (micro-batch)
    # Micro-batches per optimizer step and process: their gradients are summed before the update, so
    # a step trains on batch_size x this many sequences per process with one micro-batch's activations.
    gradient_accumulation_steps: int = 1
    seq_len: int = 128
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    # fp32: all fp32; bf16-mixed: fp32 master weights, bf16 compute; bf16: bf16 weights and compute.
    precision: str = "fp32"
    parallel: str = "ddp"  # ddp or fsdp (FSDP2, per decoder layer) when several processes run
    # Experts split across this many processes (a divisor of the process count and of num_experts);
    # 1: every process holds every expert (moe/parallel).
    expert_parallel: int = 1
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    eval_batches: int = 8
    checkpoint_every: int = 0  # 0: only at the end
    # Dense bf16 TFLOP/s per GPU that MFU is held against; 0: the GPU's spec peaks
    # (train.metrics.spec_peaks), for bf16 and, with 8-bit experts, FP8.
    peak_tflops: float = 0.0
    aux_loss_coef: float = 0.01
    # torch.compile the dense sub-blocks of each layer (moe.train.compile); CUDA only. Off by
    # default: on the H200 the step ran slower compiled (docs/benchmarks/moe.md).
    compile: bool = False
    # Capture forward + backward as one CUDA graph (moe.train.graphs); runs of one CUDA GPU only.
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "bf16-mixed", "bf16"):
            raise FoldmillError(f"precision must be fp32, bf16-mixed or bf16, not {self.precision!r}")
        if self.parallel not in ("ddp", "fsdp"):
            raise FoldmillError(f"parallel must be ddp or fsdp, not {self.parallel!r}")
        if self.expert_parallel < 1:
            raise FoldmillError(f"expert_parallel must be >= 1, not {self.expert_parallel}")
        if self.peak_tflops < 0:
            raise FoldmillError(f"peak_tflops must be >= 0 (0: the GPU's spec peak), not {self.peak_tflops}")
        if self.steps < 1 or self.batch_size < 1 or self.gradient_accumulation_steps < 1 or self.seq_len < 2:
            raise FoldmillError("steps, batch_size and gradient_accumulation_steps must be >= 1 and seq_len >= 2")
        for name, least in LEAST_SETTINGS.items():
            if not getattr(self, name) >= least:  # `not >=`: NaN fails too
                raise FoldmillError(f"{name} must be >= {least}, not {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)) or not self.grad_clip > 0:
            raise FoldmillError(f"lr and grad_clip must be finite numbers > 0, not {self.lr} and {self.grad_clip}")
        if not (self.min_lr_ratio <= 1 and self.beta1 < 1 and self.beta2 < 1):
            raise FoldmillError(f"min_lr_ratio must be <= 1 (not {self.min_lr_ratio}) and beta1, beta2 < 1 "
                                f"(not {self.beta1}, {self.beta2})")


# The least value of each TrainConfig setting that has one beyond those __post_init__ names itself;
# below it a run would divide by zero, evaluate nothing or train backwards.
LEAST_SETTINGS = {"warmup_steps": 0, "eval_every": 0, "eval_batches": 0, "checkpoint_every": 0, "log_every": 1,
                  "aux_loss_coef": 0.0, "weight_decay": 0.0, "min_lr_ratio": 0.0, "beta1": 0.0, "beta2": 0.0}


def memory_saving_settings(config: TrainConfig) -> list[str]:
    """The settings `config` does not use yet that lower a training step's memory per GPU, the least
    step time first (docs/benchmarks/moe.md), each saying whether the run resumes with it."""
    settings = []
    if config.expert_backend in EIGHT_BIT_BACKENDS and config.keep_weight_copies:
        settings.append("moe.keep_weight_copies: false (resumes, same results)")
    if config.expert_backend == "mxfp8" and not (config.mxfp8_store_swiglu_input or config.recompute_experts):
        settings.append("moe.mxfp8_store_swiglu_input: true (a new run)")
    if config.batch_size % 2 == 0:
        settings.append(f"moe.batch_size: {config.batch_size // 2} with moe.gradient_accumulation_steps: "
                        f"{2 * config.gradient_accumulation_steps} (resumes, the same sequences per step)")
    if not (config.recompute_experts or config.mxfp8_store_swiglu_input):
        settings.append("moe.recompute_experts: true (resumes, same results)")
    return settings
