"""Mixtral-style decoder: RMSNorm, rotary attention through SDPA, dropless top-k MoE feed-forward."""
