"""Whole directories written all or nothing: see foldmill.io.atomic.atomic_directory."""

from foldmill.io.atomic import atomic_directory as staging_directory

__all__ = ["staging_directory"]
