from graphc.core.errors import PlanError

__all__ = ["PlanError"]
