"""Cost models: `analytic` (closed forms, vectorized; the planner's scorer). `event` comes later."""

from paracube.cost_models.analytic import estimate, estimate_batch, evaluate

__all__ = ["estimate", "estimate_batch", "evaluate"]
