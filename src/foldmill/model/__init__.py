"""The Boltz-2-compatible folding model (fp32 reference path; parameter names match the published checkpoint).

Engine API: `Boltz2.from_checkpoint(path, config=None)`, `demo_model(config, seed, device)` and
`Boltz2.predict(features, InferenceRecipe(...))`; see foldmill.model.boltz2.
"""

from foldmill.model.boltz2 import Boltz2
from foldmill.model.config import Boltz2Config, InferenceRecipe
from foldmill.model.demo import demo_model

__all__ = ["Boltz2", "Boltz2Config", "InferenceRecipe", "demo_model"]
