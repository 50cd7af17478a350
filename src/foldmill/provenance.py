"""The demo model's marker and the warning every user-facing output shows for it.

The seeded random-weight model (`model.checkpoint: demo`) records `model: demo` in the provenance
of every prediction; the console, fold log, summary, report and export README announce it with
DEMO_WARNING. Kept free of heavy imports so any layer can use it.
"""

from __future__ import annotations

DEMO_MODEL = "demo"
DEMO_WARNING = "demo model with random weights: NOT a trained model, structures and confidences are meaningless"


def is_demo_checkpoint(checkpoint_or_model: object) -> bool:
    """True for the demo model: a `model.checkpoint` setting or a provenance `model` value of "demo"."""
    return str(checkpoint_or_model).strip() == DEMO_MODEL
