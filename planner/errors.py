"""Errors the CLI turns into one line on stderr: ``PlanInputError`` exits 2 (bad input), ``NoFeasiblePlan``
exits 1 (the job cannot be placed)."""


class PlanInputError(ValueError):
    """Bad user input; the message names the field and the allowed values."""


class NoFeasiblePlan(RuntimeError):
    """No configuration satisfies the constraints; the message says which binds and by how much."""
