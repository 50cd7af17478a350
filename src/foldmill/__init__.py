"""foldmill: proteome-scale Boltz-2-compatible structure prediction and MoE pretraining."""

__version__ = "0.1.0"
