"""trainplan: plan ML training jobs — hardware, parallel strategy, memory, time and cost — then run them.

The public API (frozen by tests/test_public_api.py)::

    from trainplan import load_job, parse_job, plan_job, get_catalog
    plan = plan_job(load_job("job.yaml"))
    plan.best.to_dict()
"""

from trainplan.catalog import find_accelerator, find_instance, get_catalog, load_catalog, resolve_model
from trainplan.errors import CatalogError, InfeasibleError, SpecError, TrainplanError
from trainplan.estimate.hardware import Hardware
from trainplan.estimate.profile import StepProfile
from trainplan.estimate.result import Estimate, Rejection, RejectKind
from trainplan.model import ModelArch
from trainplan.planner.core import Objective, Plan, estimate_option, plan_job
from trainplan.spec import Job, TabularJob, TorchJob, TransformerJob, load_job, parse_job
from trainplan.strategies import Layout, Strategy, ZeroStage

__version__ = "0.1.0"

__all__ = [
    "CatalogError",
    "Estimate",
    "Hardware",
    "InfeasibleError",
    "Job",
    "Layout",
    "ModelArch",
    "Objective",
    "Plan",
    "RejectKind",
    "Rejection",
    "SpecError",
    "StepProfile",
    "Strategy",
    "TabularJob",
    "TorchJob",
    "TrainplanError",
    "TransformerJob",
    "ZeroStage",
    "__version__",
    "estimate_option",
    "find_accelerator",
    "find_instance",
    "get_catalog",
    "load_catalog",
    "load_job",
    "parse_job",
    "plan_job",
    "resolve_model",
]
