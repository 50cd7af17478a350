"""Featurization: Targets and staged inputs into the tensors the Boltz-2 model consumes."""

from foldmill.features.featurize import FeaturizedTarget, featurize, stack_featurized
from foldmill.features.staged import StagedInputs

__all__ = ["FeaturizedTarget", "StagedInputs", "featurize", "stack_featurized"]
