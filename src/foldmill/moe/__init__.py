"""Mixture-of-experts language-model pretraining on biological sequences.

data/     FASTA corpora -> tokenized, packed, sharded training data
model/    Mixtral-style decoder (RMSNorm, rotary attention, top-k router, dropless experts)
experts/  expert backends computing the same function: loop, grouped, fp8_rowwise, mxfp8, quack
quant/    FP8 row-wise and OCP MXFP8 quantization (the numpy emulation is the test reference)
kernels/  Triton kernels (GPU only): MXFP8 quantizer and grouped GEMM, SwiGLU, token permute
train/    AdamW, cosine schedule, DDP/FSDP2, checkpoint + exact resume, metrics, evaluation
"""
