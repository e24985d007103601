"""Validation: predicted vs measured steps of a plan on local ranks."""

from paracube.validation.validate import Comparison, compare, measure, validate

__all__ = ["Comparison", "compare", "measure", "validate"]
