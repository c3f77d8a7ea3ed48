"""Estimate every candidate, keep what is feasible, rank it, explain the rest.

Pure: no printing, no mutation of its inputs (SkyPilot's optimizer pattern:
cost every candidate, then choose).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Callable, Iterable, Mapping, Sequence

from trainplan.catalog import Catalog, get_catalog
from trainplan.errors import InfeasibleError, SpecError
from trainplan.estimate.compose import compose
from trainplan.estimate.energy import option_energy, step_utilisation
from trainplan.estimate.hardware import Hardware
from trainplan.estimate.parallel import layout_error
from trainplan.estimate.profile import ProfileSource, StepProfile
from trainplan.estimate.result import Estimate, Rejection, RejectKind
from trainplan.estimate.tabular import estimate_tabular
from trainplan.estimate.transformer import transformer_profile
from trainplan.planner.candidates import candidates, gpu_hardware
from trainplan.planner.layouts import keep_useful, search_layouts
from trainplan.planner.this_machine import THIS_MACHINE
from trainplan.spec import Checkpointing, Job, KerasJob, LoraSpec, Method, ScriptJob, TabularJob, TorchJob, TransformerJob
from trainplan.strategies import Strategy, strategies_for
from trainplan.frozen import evolve

MEMORY_KINDS = (RejectKind.DEVICE_MEMORY, RejectKind.HOST_MEMORY)
HINTED_REJECTIONS = 100  # rejections that get a fit hint: the nearest, as tables and reports show them


class Objective(str, Enum):
    COST = "cost"
    TIME = "time"
    CO2 = "co2"  # kg CO2e of the whole job (estimate/energy.py)


@dataclass(frozen=True)
class Plan:
    """Ranked feasible options and explained rejections."""

    objective: Objective
    options: tuple[Estimate, ...]  # best first
    rejected: tuple[Estimate, ...]  # each with .reason
    pareto: frozenset[int]  # indices into options on the time/cost front
    warnings: tuple[str, ...] = ()  # what a user must know before taking the ranking (a borderline best option)
    # owned hardware the job does not say the user has (constraints.owned): it fits, but is listed apart, unranked
    unowned: tuple[Estimate, ...] = ()
    profile: StepProfile | None = field(default=None, compare=False)  # the neural job's step profile, made once

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


def with_energy(e: Estimate, catalog: Catalog, regions: Mapping[str, str] | None = None) -> Estimate:
    """``e`` with the kWh and kg CO2e of its whole job (``estimate/energy.py``); ``regions``: cloud → grid region."""
    util = 1.0 if e.kind == "tabular" else step_utilisation(e.time_breakdown, e.step_time_s)
    energy = option_energy(e.hardware, catalog, train_s=e.train_s, startup_s=e.startup_s, utilisation=util, regions=regions)
    return evolve(e, energy=energy)


def job_profile(job: TorchJob | TransformerJob | KerasJob, catalog: Catalog, *, trace: bool = False,
                device: str = "cuda") -> StepProfile:  # fmt: skip
    """The job's step profile: the formulas for a transformer, a trace of the real model with ``trace``
    or for a ``kind: torch`` job (which has no formulas), Keras/XLA's analysis for ``kind: keras``.
    ``device``: the target a ``kind: torch`` trace follows (``"cpu"`` for options without an accelerator)."""
    if isinstance(job, KerasJob):
        from trainplan.estimate.keras import keras_profile

        return keras_profile(job)
    if isinstance(job, TorchJob):
        from trainplan.estimate.torchjob import trace_torch_job

        return trace_torch_job(job, device=device)
    if trace:
        from trainplan.estimate.torchjob import trace_transformer_job

        return trace_transformer_job(job, catalog)
    return transformer_profile(job, catalog)


def make_estimator(
    job: Job,
    catalog: Catalog,
    *,
    efficiency_for: Callable[[Hardware], float | None] | None = None,
    trace: bool = False,
    profile: StepProfile | None = None,
    regions: Mapping[str, str] | None = None,
    lean: bool = False,
) -> Estimator:
    """A function (hardware, strategy) → Estimate for ``job``; a neural job is profiled (or traced) once.

    ``trace`` estimates a transformer from a trace of its real (Hugging Face) model instead of the formulas;
    ``profile`` reuses a profile made before (tracing takes seconds); with ``lean`` an option that does not fit
    carries no step time and no energy figure (a plan of thousands of layouts ranks only what fits).
    """
    if isinstance(job, TabularJob):

        def est_tab(hw: Hardware, strategy: Strategy | None) -> Estimate:
            rate = efficiency_for(hw) if efficiency_for else None
            return with_energy(estimate_tabular(job, hw, catalog, ns_per_cell=rate), catalog, regions)

        return est_tab
    if not isinstance(job, (TransformerJob, TorchJob, KerasJob)):
        raise TypeError(f"unsupported job {type(job).__name__}")
    prof = profile or job_profile(job, catalog, trace=trace)
    on_cpu: list[StepProfile] = []  # a kind: torch job traced for the CPU kernels, made when a CPU option comes

    def profile_for(hw: Hardware) -> StepProfile:
        if hw.accelerator is not None or not isinstance(job, TorchJob):
            return prof
        if not on_cpu:
            on_cpu.append(job_profile(job, catalog, device="cpu"))
        return on_cpu[0]

    def est(hw: Hardware, strategy: Strategy | None) -> Estimate:
        eff = efficiency_for(hw) if efficiency_for else None
        e = compose(job, profile_for(hw), hw, strategy or Strategy.SINGLE, catalog, efficiency=eff, time_rejected=not lean)
        return with_energy(e, catalog, regions) if e.fits or not lean else e

    return est


def constraint_reason(e: Estimate, job: Job) -> Rejection | None:
    """Why a fitting option still breaks the job's constraints."""
    c = job.constraints
    if c.deadline_hours is not None and e.hours > c.deadline_hours:
        return Rejection(RejectKind.DEADLINE, f"takes {e.hours:.1f} h > deadline {c.deadline_hours:g} h",
                         needed=e.hours, available=c.deadline_hours, unit="hours")
    if c.budget_usd is not None and e.cost_usd > c.budget_usd:
        return Rejection(RejectKind.BUDGET, f"costs ${e.cost_usd:,.0f} > budget ${c.budget_usd:,.0f}",
                         needed=e.cost_usd, available=c.budget_usd, unit="usd")
    return None


def rank_key(objective: Objective) -> Callable[[Estimate], tuple[float, ...]]:
    """Sort key: the objective first, the other as tie-break, then fewer devices."""
    if objective is Objective.TIME:
        return lambda e: (round(e.hours, 6), round(e.cost_usd, 4), e.devices, _simplicity(e.strategy))
    if objective is Objective.CO2:
        return lambda e: (round(e.co2_kg, 4), round(e.cost_usd, 4), round(e.hours, 6), e.devices, _simplicity(e.strategy))
    return lambda e: (round(e.cost_usd, 4), round(e.hours, 6), e.devices, _simplicity(e.strategy))


_SIMPLEST_FIRST = [s.value for s in (
    Strategy.SINGLE, Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.FSDP_GRAD_OP, Strategy.ZERO3,
    Strategy.FSDP, Strategy.ZERO1_OFFLOAD, Strategy.ZERO2_OFFLOAD, Strategy.ZERO3_OFFLOAD, Strategy.FSDP_OFFLOAD,
)]  # fmt: skip


def _simplicity(strategy: str) -> int:
    """On a tie, prefer the strategy with fewer moving parts (tabular engines rank equal)."""
    return _SIMPLEST_FIRST.index(strategy) if strategy in _SIMPLEST_FIRST else 0


def pareto_front(options: Sequence[Estimate]) -> frozenset[int]:
    """Indices of options no other option beats on both time and cost (at least as good on both, better on one).

    One sort and one sweep (Kung, Luccio & Preparata 1975, the two-dimensional case) instead of comparing every pair:
    in (hours, cost) order an option is on the front when it is the cheapest of its hours (ties on both kept) and
    cheaper than everything faster; a plan ranks thousands of options."""
    points = [(e.hours, e.cost_usd) for e in options]
    front = set()
    cheapest_faster = float("inf")  # the lowest cost among options strictly faster than the current hours
    order = sorted(range(len(points)), key=points.__getitem__)
    start = 0
    while start < len(order):
        hours = points[order[start]][0]
        end = start
        while end < len(order) and points[order[end]][0] == hours:
            end += 1
        group_cost = points[order[start]][1]  # the group's lowest cost: sorted by cost within equal hours
        if group_cost < cheapest_faster:
            front.update(i for i in order[start:end] if points[i][1] == group_cost)
        cheapest_faster = min(cheapest_faster, group_cost)
        start = end
    return frozenset(front)


def is_owned_hardware(e: Estimate) -> bool:
    """Owned rather than rented: a local instance (a workstation, this machine)."""
    return e.hardware.instance is not None and e.hardware.instance.cloud == "local"


def user_has(e: Estimate, job: Job) -> bool:
    """Whether the job says the user has this owned hardware (constraints.owned; a probed machine is theirs)."""
    inst = e.hardware.instance
    return inst is not None and (inst.name == THIS_MACHINE or inst.name in job.constraints.owned)


def rank(estimates: Iterable[Estimate], job: Job, objective: Objective) -> Plan:
    """Split into feasible and rejected (constraints applied), rank the feasible.

    Owned hardware competes with rentals only when the job says the user has it (``constraints.owned``, or this
    machine after a probe): an amortised price for a box the user would first have to buy is not a rental price,
    so those options are kept apart (``Plan.unowned``), in the same order, and never ranked.
    """
    ok: list[Estimate] = []
    rejected: list[Estimate] = []
    unowned: list[Estimate] = []
    for e in estimates:
        if not e.fits:
            rejected.append(e)
            continue
        why = constraint_reason(e, job)
        if why:
            rejected.append(replace(e, rejection=why))
        elif is_owned_hardware(e) and not user_has(e, job):
            unowned.append(e)
        else:
            ok.append(e)
    ok.sort(key=rank_key(objective))
    unowned.sort(key=rank_key(objective))
    # Rejections on the hardware of the best options first (why not DDP on the recommended
    # node?), then memory rejections closest to fitting, then the rest.
    top_hw = [e.hardware.label for e in ok[:3]]

    def rejected_key(e: Estimate) -> tuple[float, float, float]:
        label = e.hardware.label
        group = top_hw.index(label) if label in top_hw else len(top_hw)
        memory = e.rejection is not None and e.rejection.kind in MEMORY_KINDS
        ratio = (e.rejection.ratio or 1e9) if memory and e.rejection else 1e9
        return (group, ratio, e.cost_usd)

    rejected.sort(key=rejected_key)
    warnings = []
    if ok and ok[0].borderline:
        safe = next((i for i, e in enumerate(ok) if not e.borderline), None)
        alt = f"; the best option with a safe margin is #{safe + 1} ({ok[safe].hardware.label}, {ok[safe].setup})" if safe is not None else ""
        warnings.append(f"the top option ({ok[0].hardware.label}, {ok[0].setup}) is {ok[0].memory_verdict()}{alt}")
    return Plan(objective=objective, options=tuple(ok), rejected=tuple(rejected), pareto=pareto_front(ok),
                warnings=tuple(warnings), unowned=tuple(unowned))  # fmt: skip


def check_clouds(job: Job, catalog: Catalog) -> None:
    """Every name in ``constraints.clouds`` is a cloud of the catalog (built-in or the user's)."""
    known = sorted(catalog.clouds)
    for name in job.constraints.clouds or ():
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SpecError(f"{name!r} is not a cloud of the catalog{hint}; clouds: {', '.join(known)} (a user's catalog "
                            "adds more: docs/catalog.md)", field="constraints.clouds")  # fmt: skip


def check_owned(job: Job, catalog: Catalog) -> None:
    """Every name in ``constraints.owned`` is a local instance of the catalog (or this machine)."""
    local = sorted(i.name for i in catalog.instances if i.cloud == "local")
    for name in job.constraints.owned:
        if name != THIS_MACHINE and name not in local:
            close = difflib.get_close_matches(name, local, n=1)
            hint = f" (did you mean 'local:{close[0]}'?)" if close else ""
            raise SpecError(f"{name!r} is not a local instance of the catalog{hint}; owned hardware: "
                            f"{', '.join('local:' + n for n in [*local, THIS_MACHINE])}", field="constraints.owned")


def require_model(job: Job) -> None:
    """Refuse a job that describes no model (``kind: script``): there is nothing to estimate."""
    if isinstance(job, ScriptJob):
        raise SpecError("kind: script describes no model, so there is nothing to plan or estimate; describe the model "
                        "(kind: transformer, torch, keras or tabular) or run the script with trainplan run --script",
                        field="kind")


def plan_job(
    job: Job,
    catalog: Catalog | None = None,
    *,
    objective: Objective | str = Objective.COST,
    efficiency_for: Callable[[Hardware], float | None] | None = None,
    trace: bool = False,
    hints: bool = True,
    regions: Mapping[str, str] | None = None,
) -> Plan:
    """Estimate every catalog option for ``job`` and rank them.

    With ``hints``, each of the nearest ``HINTED_REJECTIONS`` options rejected for memory says what would make it
    fit (:func:`fit_hint`).
    """
    require_model(job)
    cat = catalog or get_catalog()
    check_clouds(job, cat)
    check_owned(job, cat)
    obj = Objective(objective)
    profile = None if isinstance(job, TabularJob) else job_profile(job, cat, trace=trace)
    est = make_estimator(job, cat, efficiency_for=efficiency_for, profile=profile, regions=regions, lean=True)
    estimates = [est(hw, s) for hw, s in candidates(job, cat)]
    if isinstance(job, TransformerJob) and profile is not None and profile.split is not None:
        # tensor / pipeline / context / expert parallel layouts of the same GPUs (planner/layouts.py)
        estimates += keep_useful(estimates, list(search_layouts(job, profile, gpu_hardware(job, cat), cat, est)))
    plan = rank(estimates, job, obj)
    if hints and profile is not None:
        # the nearest rejections, in the order they are shown (a plan over thousands of layouts rejects thousands)
        remedies = hint_remedies(job, cat, profile)
        hinted = tuple(with_hint(e, job, cat, profile, remedies) for e in plan.rejected[:HINTED_REJECTIONS])
        plan = replace(plan, rejected=hinted + plan.rejected[HINTED_REJECTIONS:])
    return replace(plan, profile=profile)


def require_options(plan: Plan, job: Job) -> Plan:
    """Raise :class:`InfeasibleError` naming the binding constraint when nothing is left."""
    if plan.options:
        return plan
    c = job.constraints
    if plan.unowned:
        best = plan.unowned[0]
        raise InfeasibleError(
            f"nothing the job can use fits; owned hardware it does not list would ({best.hardware.label}, {best.setup}, "
            f"{best.hours:.1f} h) — add it to constraints.owned if you have it",
            field="constraints.owned",
        )
    constraint_kinds = (RejectKind.DEADLINE, RejectKind.BUDGET)
    fitting = [e for e in plan.rejected if e.rejection and e.rejection.kind in constraint_kinds]
    if fitting and c.deadline_hours is not None and all(e.rejection.kind is RejectKind.DEADLINE for e in fitting):  # type: ignore[union-attr]
        fastest = min(fitting, key=lambda e: e.hours)
        raise InfeasibleError(
            f"no option meets deadline_hours={c.deadline_hours:g}; the fastest takes {fastest.hours:.1f} h "
            f"({fastest.hardware.label}, {fastest.setup})",
            field="constraints.deadline_hours",
        )
    if fitting and c.budget_usd is not None:
        cheapest = min(fitting, key=lambda e: e.cost_usd)
        raise InfeasibleError(
            f"no option meets budget_usd={c.budget_usd:g}; the cheapest costs ${cheapest.cost_usd:,.0f} "
            f"({cheapest.hardware.label}, {cheapest.setup})",
            field="constraints.budget_usd",
        )
    if not plan.rejected:
        raise InfeasibleError("no catalog hardware matches clouds/max_gpus/spot", field="constraints")
    # a Muon job is planned single / DDP only (estimate/compat.py): say what the sharded options would need
    muon = sum(1 for e in plan.rejected if e.rejection and e.rejection.text.startswith("muon is planned with single"))
    extra = (f" ({muon} sharded options were set aside: muon is planned with single and ddp only; optimizer: adamw "
             "plans ZeRO and FSDP)") if muon else ""  # fmt: skip
    raise InfeasibleError(
        f"no option fits; closest: {plan.rejected[0].hardware.label} {plan.rejected[0].setup}: {plan.rejected[0].reason}"
        + extra,
        field="constraints",
    )


def hint_remedies(job: Job, catalog: Catalog, profile: StepProfile) -> tuple[tuple[str, Job, StepProfile], ...]:
    """Changes to the job itself that can make it fit, each with its profile (made once per job).

    Only profiles from the formulas are rebuilt (at once); a traced profile is not re-traced.
    """
    if not isinstance(job, TransformerJob) or profile.source is not ProfileSource.ANALYTIC:
        return ()
    # each change as its alternatives, the first the job's own settings accept is offered: the default LoRA targets
    # (q_proj, v_proj) may not be this model's layers (MLA: q_a_proj …), all-linear then stands in — except on a
    # mixture of experts, where it would adapt every routed expert (not estimated: no LoRA remedy is offered)
    changes: list[list[tuple[str, dict[str, object]]]] = []
    if job.activation_checkpointing is not Checkpointing.FULL:
        changes.append([("activation_checkpointing: full", {"activation_checkpointing": Checkpointing.FULL})])
    elif job.knobs.checkpoint_fraction is not None and job.knobs.checkpoint_fraction < 1:
        # full checkpointing on a share of the blocks only: every block checkpointed is the remedy
        changes.append([("activation checkpointing on every block (knobs.checkpoint_fraction: 1)",
                         {"knobs": job.knobs.model_copy(update={"checkpoint_fraction": None})})])
    if job.method is Method.FULL:
        changes.append([("method: lora", {"method": Method.LORA}),
                        ("method: lora, lora.targets: [all-linear]",
                         {"method": Method.LORA, "lora": LoraSpec(targets=("all-linear",))})])  # fmt: skip
    out: list[tuple[str, Job, StepProfile]] = []
    for alternatives in changes:
        for label, update in alternatives:
            j = job.model_copy(update=update)
            try:
                out.append((label, j, transformer_profile(j, catalog)))
                break
            except SpecError:  # a change the job's own settings refuse (knobs.recompute_modules needs selective
                continue  # checkpointing; knobs.moe_fused_activation full training): not offered as a remedy
    return tuple(out)


def fit_hint(job: Job, hw: Hardware, strategy: Strategy | None, catalog: Catalog,
             profile: StepProfile | None = None,
             remedies: tuple[tuple[str, Job, StepProfile], ...] | None = None) -> str | None:  # fmt: skip
    """What would make a memory-rejected neural option fit: try the usual remedies, report those that work.

    Other strategies reuse the job's profile; changes to the job itself (checkpointing, LoRA) come from
    :func:`hint_remedies`.
    """
    if isinstance(job, TabularJob) or strategy is None:
        return None
    prof = profile or job_profile(job, catalog)
    changes = hint_remedies(job, catalog, prof) if remedies is None else remedies
    tries: list[tuple[str, Job, Strategy, StepProfile]] = []
    tries += [(label, j, strategy, p) for label, j, p in changes if label.startswith("activation")]
    for s in (Strategy.ZERO3, Strategy.ZERO2_OFFLOAD, Strategy.ZERO3_OFFLOAD, Strategy.FSDP_OFFLOAD):
        if s is not strategy and (hw.layout.world_size > 1 or not s.multi_device_only):
            tries.append((f"strategy {s.value}", job, s, prof))
    tries += [(label, j, strategy, p) for label, j, p in changes if not label.startswith("activation")]
    works = [label for label, j, s, p in tries if compose(j, p, hw, s, catalog).fits]  # type: ignore[arg-type]
    if works:
        return "fits with " + " or ".join(works)
    return "does not fit with checkpointing, ZeRO-3, offload or LoRA alone; add GPUs"


def with_hint(e: Estimate, job: Job, catalog: Catalog, profile: StepProfile | None = None,
              remedies: tuple[tuple[str, Job, StepProfile], ...] | None = None) -> Estimate:  # fmt: skip
    """``e`` with a fit hint when it was rejected for device memory."""
    if e.rejection is None or e.rejection.kind is not RejectKind.DEVICE_MEMORY or e.kind == "tabular":
        return e
    return replace(e, hint=fit_hint(job, e.hardware, Strategy(e.strategy), catalog, profile, remedies))


def check_layout(profile: StepProfile, hw: Hardware, strategy: Strategy | None) -> None:
    """Refuse, in one line naming the flag, a model-parallel layout the job or the hardware cannot take."""
    if hw.accelerator is None or hw.accelerator.kind != "gpu":
        raise SpecError("tensor / pipeline / context / expert parallel layouts are planned on GPUs", field="--tp/--pp/--cp/--ep")
    if profile.split is None:
        raise SpecError("tensor / pipeline / context / expert parallel layouts are planned from the formulas for full "
                        "training of decoder models (not --trace, LoRA / QLoRA, encoder models or activation offloading)",
                        field="--tp/--pp/--cp/--ep")  # fmt: skip
    err = layout_error(profile.split, hw.layout, strategy or Strategy.FSDP)
    if err is not None:
        raise SpecError(err[1], field=err[0])


def estimate_option(
    job: Job,
    hw: Hardware,
    catalog: Catalog,
    *,
    strategy: Strategy | None = None,
    efficiency_for: Callable[[Hardware], float | None] | None = None,
    trace: bool = False,
    regions: Mapping[str, str] | None = None,
) -> Estimate:
    """One configuration in detail: ``strategy`` on ``hw``, or without one the fastest strategy that fits
    (the smallest peak when none does); a memory rejection carries its fit hint."""
    require_model(job)
    if isinstance(job, TabularJob):
        return make_estimator(job, catalog, efficiency_for=efficiency_for, regions=regions)(hw, None)
    profile = job_profile(job, catalog, trace=trace)
    if hw.layout.model_parallel:
        check_layout(profile, hw, strategy)
    est = make_estimator(job, catalog, efficiency_for=efficiency_for, profile=profile, regions=regions)
    if strategy is not None:
        e = est(hw, strategy)
    else:
        # CPUs run one process on every core (estimate/cpu.py); GPUs try every strategy of their layout
        choices = (Strategy.SINGLE,) if hw.accelerator is None else strategies_for(hw.layout.world_size)
        if hw.layout.model_parallel:
            choices = tuple(s for s in choices if layout_error(profile.split, hw.layout, s) is None)  # type: ignore[arg-type]
        tried = [est(hw, s) for s in choices]
        fitting = sorted((x for x in tried if x.fits), key=rank_key(Objective.TIME))
        e = fitting[0] if fitting else min(tried, key=lambda x: x.memory.peak)
    return with_hint(e, job, catalog, profile)
