"""Pretraining: optimizer and schedule, distributed wrapping, checkpoints, metrics, the loop, evaluation."""
