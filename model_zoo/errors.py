"""Errors raised by model_zoo."""
from __future__ import annotations


class ModelSpecError(ValueError):
    """A model reference, YAML file or config.json could not be turned into a ModelSpec.

    Messages are one line and name the file (or model name) and the offending field.
    """
