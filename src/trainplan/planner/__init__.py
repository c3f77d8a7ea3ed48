"""Candidates → estimates → ranked plan; and predictions for a run on this machine."""

from trainplan.planner.core import Objective, Plan, plan_job
from trainplan.planner.local import predict_run

__all__ = ["Objective", "Plan", "plan_job", "predict_run"]
