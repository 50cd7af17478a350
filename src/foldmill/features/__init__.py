"""Featurization: Targets and staged inputs into the tensors the Boltz-2 model consumes."""
