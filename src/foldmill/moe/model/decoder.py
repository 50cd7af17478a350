"""The decoder: token embedding, pre-norm layers of attention + MoE, final norm, LM head."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from foldmill.moe.config import ModelConfig
from foldmill.moe.kernels.flash_attention_4 import require_flash_attention_4
from foldmill.moe.model.attention import Attention, DocumentMask, document_mask
from foldmill.moe.model.moe import MoEBlock
from foldmill.moe.model.norm import RMSNorm
from foldmill.moe.model.rope import rope_tables


@dataclass
class DecoderOutput:
    logits: torch.Tensor  # (batch, seq, vocab)
    aux_loss: torch.Tensor  # mean over layers of the load-balancing loss
    expert_load: torch.Tensor  # (layers, experts) fraction of assignments


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.attention = Attention(config)
        self.moe_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.moe = MoEBlock(config)

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                mask: DocumentMask | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The residual stream enters as x + delta (delta None: x alone) and leaves as the returned
        (x, delta) pair: each add is left to the norm that reads its result (RMSNorm.add_and_norm)."""
        x, normed = self.attention_norm.add_and_norm(x, delta)
        x, normed = self.moe_norm.add_and_norm(x, self.attention(normed, cos, sin, mask))
        moe = self.moe(normed)
        return x, moe.hidden, moe.aux_loss, moe.load


class MoEDecoder(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.output = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        cos, sin = rope_tables(config.head_dim, config.max_seq_len, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights; residual output projections scaled by 1/sqrt(2 * layers)."""
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.num_layers)
        for name, parameter in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(parameter)
            elif name.endswith(("wo.weight", "down_proj")):
                nn.init.normal_(parameter, std=residual_std)
            else:
                nn.init.normal_(parameter, std=std)

    def forward(self, tokens: torch.Tensor, document_ids: torch.Tensor | None = None) -> DecoderOutput:
        """tokens (batch, seq); document_ids (batch, seq), non-decreasing along seq, marks the records
        packed in each window: attention stays within a record and positions restart at its start."""
        seq = tokens.shape[1]
        if seq > self.config.max_seq_len:
            raise ValueError(f"sequence length {seq} exceeds max_seq_len {self.config.max_seq_len}")
        if self.config.attention == "flash_attn_4":
            require_flash_attention_4(tokens.device)
        mask = None
        if document_ids is None:
            cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        else:
            # FlashAttention 4 reads FlexAttention's block mask.
            mask = document_mask(document_ids, "flex" if self.config.attention == "flash_attn_4" else "auto")
            cos, sin = self.rope_cos[mask.positions], self.rope_sin[mask.positions]
        x, delta = self.embedding(tokens), None
        aux_losses, loads = [], []
        for layer in self.layers:
            x, delta, aux_loss, load = layer(x, delta, cos, sin, mask)
            aux_losses.append(aux_loss)
            loads.append(load)
        logits = self.output(self.norm.add_and_norm(x, delta)[1])
        return DecoderOutput(logits, torch.stack(aux_losses).mean(), torch.stack(loads))
