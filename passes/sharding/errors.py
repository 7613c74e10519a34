from graphc.errors import PlanError

__all__ = ["PlanError"]
