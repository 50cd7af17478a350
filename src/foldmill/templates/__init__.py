"""Template staging: read template structures, align them to query chains, search, featurize."""

from foldmill.templates.types import TemplateAlignment

__all__ = ["TemplateAlignment"]
