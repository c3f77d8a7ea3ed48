"""Estimate every candidate, keep what is feasible, rank it, explain the rest.

Pure: no printing, no mutation of its inputs (SkyPilot's optimizer pattern:
cost every candidate, then choose).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable, Iterable, Sequence

from trainplan.catalog import Catalog, get_catalog
from trainplan.errors import InfeasibleError
from trainplan.estimate.result import Estimate, Hardware
from trainplan.estimate.tabular import estimate_tabular
from trainplan.estimate.transformer import TransformerModel, estimate_transformer, resolve_transformer
from trainplan.planner.candidates import candidates
from trainplan.spec import Checkpointing, Job, Method, TabularJob, TorchJob, TransformerJob
from trainplan.strategies import Strategy


class Objective(str, Enum):
    COST = "cost"
    TIME = "time"


@dataclass(frozen=True)
class Plan:
    """Ranked feasible options and explained rejections."""

    objective: Objective
    options: tuple[Estimate, ...]  # best first
    rejected: tuple[Estimate, ...]  # each with .reason
    pareto: frozenset[int]  # indices into options on the time/cost front

    @property
    def best(self) -> Estimate | None:
        return self.options[0] if self.options else None

    @property
    def cheapest(self) -> Estimate | None:
        return min(self.options, key=lambda e: (e.cost_usd, e.hours), default=None)

    @property
    def fastest(self) -> Estimate | None:
        return min(self.options, key=lambda e: (e.hours, e.cost_usd), default=None)


Estimator = Callable[[Hardware, "Strategy | None"], Estimate]


def make_estimator(
    job: Job,
    catalog: Catalog,
    *,
    efficiency_for: Callable[[Hardware], float | None] | None = None,
    trace: bool = False,
) -> Estimator:
    """A function (hardware, strategy) → Estimate for ``job``, with its model resolved (or traced) once.

    ``trace`` estimates a transformer from a trace of its real (Hugging Face) model instead of the formulas.
    """
    if isinstance(job, TransformerJob) and trace:
        from trainplan.estimate.torchjob import make_traced_transformer_estimator

        return make_traced_transformer_estimator(job, catalog, efficiency_for=efficiency_for)
    if isinstance(job, TransformerJob):
        model: TransformerModel = resolve_transformer(job)

        def est(hw: Hardware, strategy: Strategy | None) -> Estimate:
            eff = efficiency_for(hw) if efficiency_for else None
            return estimate_transformer(job, hw, strategy or Strategy.SINGLE, catalog, model=model, efficiency=eff)

        return est
    if isinstance(job, TabularJob):

        def est_tab(hw: Hardware, strategy: Strategy | None) -> Estimate:
            rate = efficiency_for(hw) if efficiency_for else None
            return estimate_tabular(job, hw, catalog, ns_per_cell=rate)

        return est_tab
    if isinstance(job, TorchJob):
        from trainplan.estimate.torchjob import make_torch_estimator

        return make_torch_estimator(job, catalog, efficiency_for=efficiency_for)
    raise TypeError(f"unsupported job {type(job).__name__}")


def constraint_reason(e: Estimate, job: Job) -> str | None:
    """Why a fitting option still breaks the job's constraints."""
    c = job.constraints
    if c.deadline_hours is not None and e.hours > c.deadline_hours:
        return f"takes {e.hours:.1f} h > deadline {c.deadline_hours:g} h"
    if c.budget_usd is not None and e.cost_usd > c.budget_usd:
        return f"costs ${e.cost_usd:,.0f} > budget ${c.budget_usd:,.0f}"
    return None


def rank_key(objective: Objective) -> Callable[[Estimate], tuple[float, ...]]:
    """Sort key: the objective first, the other as tie-break, then fewer devices."""
    if objective is Objective.TIME:
        return lambda e: (round(e.hours, 6), round(e.cost_usd, 4), e.devices, _simplicity(e.strategy))
    return lambda e: (round(e.cost_usd, 4), round(e.hours, 6), e.devices, _simplicity(e.strategy))


_SIMPLEST_FIRST = [s.value for s in (
    Strategy.SINGLE, Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.FSDP_GRAD_OP, Strategy.ZERO3,
    Strategy.FSDP, Strategy.ZERO2_OFFLOAD, Strategy.ZERO3_OFFLOAD,
)]  # fmt: skip


def _simplicity(strategy: str) -> int:
    """On a tie, prefer the strategy with fewer moving parts (tabular engines rank equal)."""
    return _SIMPLEST_FIRST.index(strategy) if strategy in _SIMPLEST_FIRST else 0


def pareto_front(options: Sequence[Estimate]) -> frozenset[int]:
    """Indices of options no other option beats on both time and cost."""
    front = set()
    for i, a in enumerate(options):
        dominated = any(
            (b.hours <= a.hours and b.cost_usd <= a.cost_usd) and (b.hours < a.hours or b.cost_usd < a.cost_usd)
            for j, b in enumerate(options)
            if j != i
        )
        if not dominated:
            front.add(i)
    return frozenset(front)


def rank(estimates: Iterable[Estimate], job: Job, objective: Objective) -> Plan:
    """Split into feasible and rejected (constraints applied), rank the feasible."""
    ok: list[Estimate] = []
    rejected: list[Estimate] = []
    for e in estimates:
        if not e.fits:
            rejected.append(e)
            continue
        why = constraint_reason(e, job)
        if why:
            rejected.append(replace(e, fits=False, reason=why))
        else:
            ok.append(e)
    ok.sort(key=rank_key(objective))
    # Rejections on the hardware of the best options first (why not DDP on the recommended
    # node?), then memory rejections closest to fitting, then the rest.
    top_hw = [e.hardware.label for e in ok[:3]]

    def rejected_key(e: Estimate) -> tuple[float, float, float]:
        label = e.hardware.label
        group = top_hw.index(label) if label in top_hw else len(top_hw)
        memory = (e.reason or "").startswith("needs")
        ratio = e.memory.peak / (e.capacity_gib * 2**30) if memory and e.capacity_gib else 1e9
        return (group, ratio, e.cost_usd)

    rejected.sort(key=rejected_key)
    return Plan(objective=objective, options=tuple(ok), rejected=tuple(rejected), pareto=pareto_front(ok))


def plan_job(
    job: Job,
    catalog: Catalog | None = None,
    *,
    objective: Objective | str = Objective.COST,
    efficiency_for: Callable[[Hardware], float | None] | None = None,
    trace: bool = False,
) -> Plan:
    """Estimate every catalog option for ``job`` and rank them."""
    cat = catalog or get_catalog()
    obj = Objective(objective)
    est = make_estimator(job, cat, efficiency_for=efficiency_for, trace=trace)
    return rank((est(hw, s) for hw, s in candidates(job, cat)), job, obj)


def require_options(plan: Plan, job: Job) -> Plan:
    """Raise :class:`InfeasibleError` naming the binding constraint when nothing is left."""
    if plan.options:
        return plan
    c = job.constraints
    fitting = [e for e in plan.rejected if e.reason and ("deadline" in e.reason or "budget" in e.reason)]
    if fitting and c.deadline_hours is not None and all("deadline" in (e.reason or "") for e in fitting):
        fastest = min(fitting, key=lambda e: e.hours)
        raise InfeasibleError(
            f"no option meets deadline_hours={c.deadline_hours:g}; the fastest takes {fastest.hours:.1f} h "
            f"({fastest.hardware.label}, {fastest.strategy})",
            field="constraints.deadline_hours",
        )
    if fitting and c.budget_usd is not None:
        cheapest = min(fitting, key=lambda e: e.cost_usd)
        raise InfeasibleError(
            f"no option meets budget_usd={c.budget_usd:g}; the cheapest costs ${cheapest.cost_usd:,.0f} "
            f"({cheapest.hardware.label}, {cheapest.strategy})",
            field="constraints.budget_usd",
        )
    if not plan.rejected:
        raise InfeasibleError("no catalog hardware matches clouds/max_gpus/spot", field="constraints")
    raise InfeasibleError(
        f"no option fits; closest: {plan.rejected[0].hardware.label} {plan.rejected[0].strategy}: {plan.rejected[0].reason}",
        field="constraints",
    )


def fit_hint(job: Job, hw: Hardware, strategy: Strategy | None, catalog: Catalog) -> str | None:
    """What would make a memory-rejected neural option fit: try the usual remedies, report those that work."""
    if not isinstance(job, TransformerJob) or strategy is None:
        return None
    tries: list[tuple[str, Job, Strategy]] = []
    if job.activation_checkpointing is not Checkpointing.FULL:
        tries.append(("activation_checkpointing: full", job.model_copy(update={"activation_checkpointing": Checkpointing.FULL}), strategy))
    for s in (Strategy.ZERO3, Strategy.ZERO2_OFFLOAD, Strategy.ZERO3_OFFLOAD):
        if s is not strategy and (hw.layout.world_size > 1 or not s.multi_device_only):
            tries.append((f"strategy {s.value}", job, s))
    if job.method is Method.FULL:
        tries.append(("method: lora", job.model_copy(update={"method": Method.LORA}), strategy))
    works = []
    for label, j, s in tries:
        e = estimate_transformer(j, hw, s, catalog)  # type: ignore[arg-type]
        if e.fits:
            works.append(label)
    return "fits with " + " or ".join(works) if works else "does not fit with checkpointing, ZeRO-3, offload or LoRA alone; add GPUs"
