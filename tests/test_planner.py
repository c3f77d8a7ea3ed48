"""The planner: ranking against a brute-force oracle, the Pareto front, constraints, and the reference plans.

Random cases use ``random.Random(seed)`` with fixed seeds, so a failure reproduces exactly.
"""

from __future__ import annotations

from trainplan.estimate.tabular import MAX_TABULAR_NODES, MULTI_NODE_LIBRARIES

import csv
import itertools
import random
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from trainplan import InfeasibleError, Objective, get_catalog, load_catalog, load_job, parse_job, plan_job
from trainplan.errors import SpecError
from trainplan.spec import TabularLibrary
from trainplan.catalog import DATA_DIR, CloudTerms, find_accelerator
from trainplan.estimate.memory import GIB, MemoryBreakdown
from trainplan.estimate.result import Estimate, Hardware, Rejection, RejectKind, billed_seconds
from trainplan.estimate.tabular import estimate_tabular
from trainplan.estimate.transformer import estimate_transformer
from trainplan.estimate.hardware import hardware_for_instance_cpus
from trainplan.planner.candidates import hardware_for_gpu, hardware_for_instance
from trainplan.planner.core import pareto_front, rank, rank_key, require_options
from trainplan.strategies import Layout, Strategy

FIXTURES = Path(__file__).parent / "fixtures" / "jobs"


@pytest.fixture(autouse=True)
def _no_calibrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans must not depend on measured runs of the machine the tests run on."""
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def ref_plan():
    return plan_job(load_job(FIXTURES / "llama7b-sft.yaml"))


@pytest.fixture(scope="module")
def xgb_plan():
    return plan_job(load_job(FIXTURES / "xgboost-10m.yaml"))


# ----------------------------------------------------------------------------- hand-built estimates


def _hw(devices: int) -> Hardware:
    return Hardware(
        layout=Layout(gpus_per_node=devices, nodes=1),
        accelerator=None,
        instance=None,
        price_usd_per_h_per_node=1.0,
        price_note="test",
        vcpus_per_node=4,
        ram_gib_per_node=16.0,
        intra_node_bw_gb_s=None,
        network_gbps=None,
        cloud="aws",
        terms=None,
    )


def _est(tag: int, *, hours: float, cost: float, devices: int = 1, fits: bool = True) -> Estimate:
    return Estimate(
        kind="tabular",
        strategy="cpu",
        hardware=_hw(devices),
        rejection=None if fits else Rejection(RejectKind.HOST_MEMORY, "needs 99.0 GiB RAM > 16 GiB", 99 * GIB, 16 * GIB, "bytes"),
        memory=MemoryBreakdown(weights=0.0, gradients=0.0, optimizer=0.0, activations=GIB, overhead=0.0),
        capacity_gib=16.0,
        step_time_s=1.0,
        steps=1,
        train_s=hours * 3600.0,
        startup_s=0.0,
        cost_usd=cost,
        throughput=1.0,
        throughput_unit="samples_per_s",
        mfu=None,
        notes=(f"id{tag}",),
    )


def _tag(e: Estimate) -> str:
    return e.notes[0]


def _tabular_job(**constraints):
    return parse_job({"kind": "tabular", "library": "xgboost", "rows": 1000, "features": 10,
                      "constraints": {k: v for k, v in constraints.items() if v is not None}})  # fmt: skip


def _random_estimates(rng: random.Random, n: int) -> list[Estimate]:
    # Values on a coarse grid so that ties (the tie-break rules) happen often and rounding cannot matter.
    grid = rng.choice((3, 12))
    return [
        _est(i, hours=rng.randint(1, grid) * 0.5, cost=rng.randint(1, grid) * 1.5, devices=rng.choice((1, 2, 4, 8)),
             fits=rng.random() < 0.75)
        for i in range(n)
    ]  # fmt: skip


def _oracle_key(objective: Objective):
    if objective is Objective.COST:
        return lambda e: (e.cost_usd, e.hours, e.devices)
    if objective is Objective.CO2:  # kg CO2e (unknown: last), then cost, then time
        return lambda e: (e.co2_kg, e.cost_usd, e.hours, e.devices)
    return lambda e: (e.hours, e.cost_usd, e.devices)


def _brute_pareto(points: list[tuple[float, float]]) -> set[int]:
    """O(n²) by definition: i is on the front unless some j is no worse on both and differs."""
    return {
        i
        for i, (h, c) in enumerate(points)
        if not any(h2 <= h and c2 <= c and (h2, c2) != (h, c) for h2, c2 in points)
    }


CASES = [(seed, obj) for seed in range(150) for obj in Objective]


@pytest.mark.parametrize(("seed", "objective"), CASES)
def test_rank_matches_brute_force_oracle(seed: int, objective: Objective) -> None:
    rng = random.Random(seed)
    estimates = _random_estimates(rng, rng.randint(0, 14))
    deadline = rng.choice((None, 1.0, 2.5))
    budget = rng.choice((None, 3.0, 6.0))
    job = _tabular_job(deadline_hours=deadline, budget_usd=budget)
    before = list(estimates)

    plan = rank(iter(estimates), job, objective)

    assert estimates == before  # pure: the input is not touched

    def allowed(e: Estimate) -> bool:
        return e.fits and (deadline is None or e.hours <= deadline) and (budget is None or e.cost_usd <= budget)

    feasible = [e for e in estimates if allowed(e)]
    # exactly the feasible options, the same objects, nothing else
    assert sorted(map(_tag, plan.options)) == sorted(map(_tag, feasible))
    assert all(any(o is e for e in feasible) for o in plan.options)
    # sorted by the objective, ties broken by the other, then by fewer devices
    key = _oracle_key(objective)
    assert [key(e) for e in plan.options] == sorted(key(e) for e in feasible)
    # everything else is rejected, each with a reason naming why
    assert sorted(map(_tag, plan.rejected)) == sorted(_tag(e) for e in estimates if not allowed(e))
    for r in plan.rejected:
        original = next(e for e in estimates if _tag(e) == _tag(r))
        assert not r.fits and r.reason
        if original.fits:  # it fitted in memory: a constraint rejected it
            if deadline is not None and original.hours > deadline:
                assert r.reason.startswith("takes") and "deadline" in r.reason
            else:
                assert budget is not None and original.cost_usd > budget
                assert "budget" in r.reason
        else:
            assert r.reason == original.reason
    # the front is indexed into the ranked options
    assert plan.pareto == _brute_pareto([(e.hours, e.cost_usd) for e in plan.options])
    if feasible:
        assert plan.best is plan.options[0]
        assert (plan.cheapest.cost_usd, plan.cheapest.hours) == min((e.cost_usd, e.hours) for e in feasible)
        assert (plan.fastest.hours, plan.fastest.cost_usd) == min((e.hours, e.cost_usd) for e in feasible)
        assert plan.pareto  # a non-empty set always has a front
    else:
        assert plan.best is None and plan.cheapest is None and plan.fastest is None


@pytest.mark.parametrize("seed", range(200))
def test_pareto_front_matches_brute_force(seed: int) -> None:
    rng = random.Random(1000 + seed)
    n = rng.randint(0, 25)
    grid = rng.choice((3, 6, 50))  # small grids: many duplicates and ties
    opts = [_est(i, hours=rng.randint(1, grid) / 4, cost=rng.randint(1, grid) / 2) for i in range(n)]
    front = pareto_front(opts)
    assert front == _brute_pareto([(e.hours, e.cost_usd) for e in opts])
    # and its defining properties: every option off the front is beaten by one on it; none on it beats another
    for i in set(range(n)) - front:
        assert any(opts[j].hours <= opts[i].hours and opts[j].cost_usd <= opts[i].cost_usd for j in front)
    for i, j in itertools.permutations(front, 2):
        a, b = opts[i], opts[j]
        assert not (b.hours <= a.hours and b.cost_usd <= a.cost_usd and (b.hours, b.cost_usd) != (a.hours, a.cost_usd))


def test_pareto_front_small_example() -> None:
    opts = [
        _est(0, hours=1.0, cost=10.0),  # fastest
        _est(1, hours=2.0, cost=5.0),  # middle
        _est(2, hours=3.0, cost=5.0),  # dominated by 1 (slower, same cost)
        _est(3, hours=4.0, cost=1.0),  # cheapest
        _est(4, hours=2.0, cost=5.0),  # duplicate of 1: neither beats the other
        _est(5, hours=5.0, cost=20.0),  # dominated by everything
    ]
    assert pareto_front(opts) == {0, 1, 3, 4}


def test_rank_key_tie_breaks() -> None:
    a = _est(0, hours=1.0, cost=5.0, devices=8)
    b = _est(1, hours=1.0, cost=5.0, devices=1)
    c = _est(2, hours=2.0, cost=5.0, devices=1)
    d = _est(3, hours=0.5, cost=6.0, devices=1)
    assert sorted([a, b, c, d], key=rank_key(Objective.COST)) == [b, a, c, d]
    assert sorted([a, b, c, d], key=rank_key(Objective.TIME)) == [d, b, a, c]


def test_require_options_names_the_binding_constraint() -> None:
    slow = [_est(0, hours=3.0, cost=1.0), _est(1, hours=2.0, cost=9.0)]
    job = _tabular_job(deadline_hours=1.0)
    with pytest.raises(InfeasibleError) as info:
        require_options(rank(slow, job, Objective.COST), job)
    assert info.value.field == "constraints.deadline_hours"
    assert "the fastest takes 2.0 h" in str(info.value)

    job = _tabular_job(budget_usd=0.5)
    with pytest.raises(InfeasibleError) as info:
        require_options(rank(slow, job, Objective.COST), job)
    assert info.value.field == "constraints.budget_usd"
    assert "the cheapest costs $1" in str(info.value)

    job = _tabular_job()
    with pytest.raises(InfeasibleError, match="no option fits; closest"):
        require_options(rank([_est(0, hours=1, cost=1, fits=False)], job, Objective.COST), job)
    with pytest.raises(InfeasibleError, match="no catalog hardware"):
        require_options(rank([], job, Objective.COST), job)
    ok = rank(slow, job, Objective.COST)
    assert require_options(ok, job) is ok


# ----------------------------------------------------------------------------- plan_job on small random catalogs


def _random_catalog(rng: random.Random, *, gpu_only: bool):
    cat = get_catalog()
    pool = [i for i in cat.instances if i.accelerator is not None] if gpu_only else list(cat.instances)
    chosen = rng.sample(pool, rng.randint(1, 6))
    repriced = []
    for inst in chosen:
        price = round(inst.price_usd_per_h * rng.uniform(0.3, 3.0), 4)
        repriced.append(replace(inst, price_usd_per_h=price, spot_price_usd_per_h=None))
    return replace(cat, instances=tuple(repriced))


@pytest.mark.parametrize("seed", range(40))
def test_plan_job_tabular_on_random_catalogs(seed: int) -> None:
    rng = random.Random(seed)
    cat = _random_catalog(rng, gpu_only=False)
    clouds = rng.sample(["aws", "gcp", "azure", "local"], rng.randint(1, 4))
    job = parse_job({"kind": "tabular", "library": rng.choice(["xgboost", "lightgbm", "sklearn-hgb"]),
                     "rows": rng.choice([10_000, 1_000_000, 50_000_000]), "features": rng.randint(5, 200),
                     "trees": rng.randint(10, 500), "cv_folds": rng.choice([1, 5]),
                     "constraints": {"clouds": clouds, "max_gpus": rng.choice([1, 8, 64])}})  # fmt: skip
    plan = plan_job(job, cat)

    # brute force: every instance the constraints allow, estimated one by one
    allowed = [i for i in cat.instances if i.cloud in clouds and i.accelerator_count <= job.constraints.max_gpus]
    # XGBoost / LightGBM also over 2, 4, 8, 16 networked CPU machines (one model through Dask)
    layouts = [(i, 1) for i in allowed] + [
        (i, n) for i in allowed for n in (2, 4, 8, MAX_TABULAR_NODES)
        if i.accelerator is None and i.cloud != "local" and i.network_gbps and job.library in MULTI_NODE_LIBRARIES
    ]  # fmt: skip
    brute = [estimate_tabular(job, hardware_for_instance(i, cat, nodes=n), cat) for i, n in layouts]
    # owned hardware the job does not list is kept apart, never ranked against rentals
    owned = [e for e in brute if e.fits and e.hardware.instance.cloud == "local"]
    fitting = [e for e in brute if e.fits and e.hardware.instance.cloud != "local"]
    assert sorted(e.hardware.label for e in plan.options) == sorted(e.hardware.label for e in fitting)
    assert sorted(e.hardware.label for e in plan.unowned) == sorted(e.hardware.label for e in owned)
    assert len(plan.options) + len(plan.rejected) + len(plan.unowned) == len(layouts)
    if fitting:
        assert plan.best.cost_usd == pytest.approx(min(e.cost_usd for e in fitting))
    costs = [e.cost_usd for e in plan.options]
    assert costs == sorted(costs)


def _tiny_transformer(**extra):
    data = {"kind": "transformer", "seq_len": 256, "micro_batch": 2, "global_batch": 16, "steps": 100,
            "model": {"layers": 2, "hidden": 256, "heads": 4, "ffn_hidden": 688, "vocab": 32000}}  # fmt: skip
    data.update(extra)
    return parse_job(data)


@pytest.mark.parametrize("seed", range(25))
def test_plan_job_transformer_single_node_options_match_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    cat = _random_catalog(rng, gpu_only=True)
    objective = rng.choice(list(Objective))
    job = _tiny_transformer()
    plan = plan_job(job, cat, objective=objective)

    # brute force over every instance × every strategy on one node (invalid pairs reject themselves), but ZeRO-1
    # offload on one GPU: there it holds ZeRO-2 offload's states plus the full gradients, for the same time (below)
    brute = [estimate_transformer(job, hardware_for_instance(i, cat), s, cat) for i in cat.instances for s in Strategy
             if not (s is Strategy.ZERO1_OFFLOAD and i.accelerator_count == 1)]  # fmt: skip
    for i in (i for i in cat.instances if i.accelerator_count == 1):
        z1, z2 = (estimate_transformer(job, hardware_for_instance(i, cat), s, cat)
                  for s in (Strategy.ZERO1_OFFLOAD, Strategy.ZERO2_OFFLOAD))  # fmt: skip
        assert z1.memory.peak >= z2.memory.peak and z1.step_time_s >= z2.step_time_s * (1 - 1e-9)
    # and the CPUs of each owned machine, one process on every core (planner/candidates.py, estimate/cpu.py)
    brute += [estimate_transformer(job, hardware_for_instance_cpus(i, cat), Strategy.SINGLE, cat)
              for i in cat.instances if i.cloud == "local"]  # fmt: skip
    # owned machines the job does not list (constraints.owned) fit, but are kept apart from the ranking
    brute_fit = {(e.hardware.label, e.strategy) for e in brute if e.fits and e.hardware.instance.cloud != "local"}
    brute_owned = {(e.hardware.label, e.strategy) for e in brute if e.fits and e.hardware.instance.cloud == "local"}
    planned_single_node = {(e.hardware.label, e.strategy) for e in plan.options if e.hardware.layout.nodes == 1}
    assert planned_single_node == brute_fit
    assert {(e.hardware.label, e.strategy) for e in plan.unowned} == brute_owned
    key = _oracle_key(objective)
    best_brute = min((e for e in brute if e.fits and e.hardware.instance.cloud != "local"), key=key, default=None)
    if best_brute is not None:  # more nodes may only do better, never worse (ties as the planner rounds them)
        assert rank_key(objective)(plan.best) <= rank_key(objective)(best_brute)
    assert [rank_key(objective)(e) for e in plan.options] == sorted(rank_key(objective)(e) for e in plan.options)


# ----------------------------------------------------------------------------- the reference job (LLaMA-7B full fine-tune)


def _model_states_gib(reason: str) -> float:
    m = re.search(r"model states ([\d.]+)", reason)
    assert m, reason
    return float(m.group(1))


def test_reference_plan_has_options_and_explains_rejections(ref_plan) -> None:
    assert ref_plan.options and ref_plan.rejected
    assert all(e.fits and e.reason is None for e in ref_plan.options)
    assert all(not e.fits and e.reason for e in ref_plan.rejected)
    assert ref_plan.best is ref_plan.cheapest
    costs = [round(e.cost_usd, 4) for e in ref_plan.options]  # rank_key: costs within $0.0001 tie, hours decide
    assert costs == sorted(costs)
    assert ref_plan.pareto == _brute_pareto([(e.hours, e.cost_usd) for e in ref_plan.options])


@pytest.mark.parametrize("acc_id", ["A100-80GB", "H100-80GB"])
def test_reference_plan_no_ddp_on_80gb_gpus(ref_plan, acc_id: str) -> None:
    def on(e: Estimate) -> bool:
        return e.strategy == "ddp" and e.hardware.accelerator is not None and e.hardware.accelerator.id == acc_id

    assert not [e for e in ref_plan.options if on(e)]
    memory_rejections = [e for e in ref_plan.rejected if on(e) and e.reason.startswith("needs")]
    assert memory_rejections
    for e in memory_rejections:
        assert _model_states_gib(e.reason) >= 100  # 16 bytes/param × 6.74e9 params = 100.4 GiB
        assert e.memory.peak > 80 * GIB


def _ref_estimate(acc: str, gpus: int, strategy: Strategy) -> Estimate:
    job = load_job(FIXTURES / "llama7b-sft.yaml")
    cat = get_catalog()
    return estimate_transformer(job, hardware_for_gpu(find_accelerator(acc), cat, gpus=gpus), strategy, cat)


def test_reference_zero2_fits_4x_a100_80gb_not_4x_a100_40gb() -> None:
    e80 = _ref_estimate("A100-80GB", 4, Strategy.ZERO2)
    assert e80.fits and e80.memory.peak < 80 * GIB
    e40 = _ref_estimate("A100-40GB", 4, Strategy.ZERO2)
    assert not e40.fits and e40.reason.startswith("needs") and e40.memory.peak > 40 * GIB
    off = _ref_estimate("A100-40GB", 4, Strategy.ZERO2_OFFLOAD)
    assert off.fits and off.memory.peak < 40 * GIB and off.memory.host > 0
    # offload moves the optimizer state off the GPU: less device memory, more step time on the same GPUs
    assert off.memory.optimizer < e40.memory.optimizer
    assert off.step_time_s > e40.step_time_s


def test_reference_memory_decreases_with_zero_stage() -> None:
    peaks = [_ref_estimate("A100-80GB", 8, s).memory.peak for s in (Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3)]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > peaks[-1]


def test_world_size_that_does_not_divide_the_global_batch_is_rejected() -> None:
    e = _ref_estimate("A100-80GB", 3, Strategy.ZERO2)
    assert not e.fits
    assert "global_batch 128" in e.reason and "4×3" in e.reason


# ----------------------------------------------------------------------------- the XGBoost 10M-row example


def test_xgboost_is_planned_on_one_machine(xgb_plan) -> None:
    assert xgb_plan.options
    for e in xgb_plan.options:
        assert e.hardware.layout.nodes == 1 or (e.strategy == "dask-cpu" and e.hardware.accelerator is None)
        # several GPUs of the node only as one model over all of them (xgboost.dask, one worker per GPU)
        assert e.hardware.layout.world_size <= 1 or e.hardware.accelerator is None or e.strategy == "dask-gpu"
        assert e.to_dict()["count"] <= 1 or e.strategy == "dask-gpu"
    assert any(e.hardware.accelerator is None for e in xgb_plan.options)  # CPU instances compete
    assert any(e.hardware.accelerator is not None and e.strategy == "gpu" for e in xgb_plan.options)  # single GPUs
    assert any(e.strategy == "dask-gpu" for e in xgb_plan.options)  # and a node's GPUs together


def test_libraries_without_a_multi_gpu_path_reject_every_multi_gpu_instance_with_a_reason() -> None:
    plan = plan_job(load_job(FIXTURES / "xgboost-10m.yaml").model_copy(update={"library": TabularLibrary.LIGHTGBM}))
    multi = {f"{i.cloud}:{i.name}" for i in get_catalog().instances if i.accelerator_count > 1}
    rejected = {e.hardware.label: e for e in plan.rejected}
    assert multi <= set(rejected)
    tpus = {f"{i.cloud}:{i.name}" for i in get_catalog().instances if i.accelerator and i.accelerator.startswith("TPU")}
    for label in multi:
        reason = rejected[label].reason
        if label in tpus:
            assert reason and "TPU" in reason, (label, reason)
        else:
            assert reason and "idle" in reason and "1-GPU" in reason, (label, reason)


def _catalog_without_startup(tmp_path: Path):
    d = tmp_path / "data"
    shutil.copytree(DATA_DIR, d)
    path = d / "clouds.csv"
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        fields, rows = list(reader.fieldnames or []), list(reader)
    for r in rows:
        r["startup_s"] = "0"
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    cat = load_catalog(d)
    assert cat.issues == ()
    return cat


def test_billing_minimum_is_charged_for_a_tiny_job(tmp_path: Path) -> None:
    cat = _catalog_without_startup(tmp_path)  # so that the billing minimum, not start-up, decides
    job = parse_job({"kind": "tabular", "library": "xgboost", "rows": 1000, "features": 10, "trees": 10})
    plan = plan_job(job, cat)
    billed_clouds = 0
    for e in plan.options:
        assert e.train_s < 60
        hw = e.hardware
        per_s = hw.price_usd_per_h_per_node * hw.layout.nodes / 3600
        if hw.terms.billing_minimum_s:
            billed_clouds += 1
            assert e.cost_usd == pytest.approx(per_s * hw.terms.billing_minimum_s)
            assert e.cost_usd > per_s * e.train_s * 100
        else:  # owned workstation, or a cloud billing by the second without a minimum
            assert hw.cloud == "local" or hw.terms.billing_increment_s <= 1
            assert e.cost_usd == pytest.approx(per_s * billed_seconds(e.train_s, hw.terms))  # whole seconds, or exact
    assert billed_clouds > 10


def test_cost_is_priced_by_billed_time_in_the_real_catalog(xgb_plan) -> None:
    for e in xgb_plan.options:
        hw = e.hardware
        billed = billed_seconds(e.train_s + e.startup_s, hw.terms)
        assert billed >= (hw.terms.billing_minimum_s if hw.terms else 0)
        assert e.cost_usd == pytest.approx(billed / 3600 * hw.price_usd_per_h_per_node * hw.layout.nodes)


@pytest.mark.parametrize(
    ("seconds", "increment", "minimum", "expected"),
    [(0.5, 1, 60, 60), (59.9, 1, 60, 60), (61.5, 1, 60, 62), (61.5, 60, 60, 120), (120.0, 60, 60, 120),
     (3.2, 0, 0, 3.2)],
)  # fmt: skip
def test_billed_seconds(seconds: float, increment: float, minimum: float, expected: float) -> None:
    terms = CloudTerms("x", billing_increment_s=increment, billing_minimum_s=minimum, startup_s=0, source="t", as_of="2026-01-01")
    assert billed_seconds(seconds, terms) == pytest.approx(expected)
    assert billed_seconds(seconds, None) == seconds


# ----------------------------------------------------------------------------- constraints on a real plan


def test_deadline_rejects_slow_options_with_reasons(ref_plan) -> None:
    hours = sorted(e.hours for e in ref_plan.options)
    deadline = round(hours[len(hours) // 2], 3)
    job = _reference_with(constraints={"deadline_hours": deadline})
    plan = plan_job(job)
    assert plan.options and all(e.hours <= deadline for e in plan.options)
    late = [e for e in plan.rejected if e.reason.startswith("takes")]
    assert late and all(e.hours > deadline and f"deadline {deadline:g} h" in e.reason for e in late)
    rented_late = [e for e in late if e.hardware.instance.cloud != "local"]  # unowned workstations are not ranked
    assert len(plan.options) + len(rented_late) == len(ref_plan.options)


def test_budget_rejects_expensive_options_with_reasons(ref_plan) -> None:
    costs = sorted(e.cost_usd for e in ref_plan.options)
    budget = round(costs[len(costs) // 2], 2)
    plan = plan_job(_reference_with(constraints={"budget_usd": budget}))
    assert plan.options and all(e.cost_usd <= budget for e in plan.options)
    over = [e for e in plan.rejected if e.reason.startswith("costs")]
    assert over and all(e.cost_usd > budget and "budget" in e.reason for e in over)


def test_impossible_deadline_and_budget_raise(ref_plan) -> None:
    for constraints, field in (({"deadline_hours": 0.001}, "constraints.deadline_hours"),
                               ({"budget_usd": 0.01}, "constraints.budget_usd")):  # fmt: skip
        job = _reference_with(constraints=constraints)
        with pytest.raises(InfeasibleError) as info:
            require_options(plan_job(job), job)
        assert info.value.field == field


def _reference_with(**changes):
    import yaml

    data = yaml.safe_load((FIXTURES / "llama7b-sft.yaml").read_text(encoding="utf-8"))
    if "constraints" in changes:  # added to the fixture's own (its clouds), as a user edits a job file
        changes = {**changes, "constraints": {**data.get("constraints", {}), **changes["constraints"]}}
    data.update(changes)
    return parse_job(data)


def test_clouds_and_max_gpus_constraints(ref_plan) -> None:
    plan = plan_job(_reference_with(constraints={"clouds": ["gcp", "azure"], "max_gpus": 8}))
    assert plan.options
    assert {e.hardware.cloud for e in plan.options + plan.rejected} <= {"gcp", "azure"}
    assert max(e.devices for e in plan.options + plan.rejected) <= 8


def test_spot_prices_are_used_when_asked() -> None:
    plan = plan_job(_reference_with(constraints={"spot": True}))
    assert plan.options
    for e in plan.options:
        inst = e.hardware.instance
        if inst.cloud != "local":
            assert inst.spot_price_usd_per_h is not None
            assert e.hardware.price_usd_per_h_per_node == inst.spot_price_usd_per_h


def test_objective_time_ranks_the_fastest_first(ref_plan) -> None:
    plan = plan_job(load_job(FIXTURES / "llama7b-sft.yaml"), objective="time")
    assert plan.best.hours == min(e.hours for e in plan.options)
    assert len(plan.options) == len(ref_plan.options)


# ----------------------------------------------------------------------------- precision on accelerators without it


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_fp16_and_fp32_jobs_can_be_planned(precision: str) -> None:
    plan = plan_job(_tiny_transformer(precision=precision))
    assert plan.options
    tpu = [e for e in plan.options + plan.rejected if e.hardware.accelerator and e.hardware.accelerator.kind == "tpu"]
    assert tpu
    if precision == "fp16":
        assert all(not e.fits and "fp16" in e.reason for e in tpu)


# ----------------------------------------------------------------------------- owned vs rented (issue 19)


def test_owned_hardware_is_ranked_only_when_the_job_says_the_user_has_it(ref_plan) -> None:
    assert ref_plan.options and not any(e.hardware.label.startswith("local:") for e in ref_plan.options)
    assert ref_plan.unowned and all(e.hardware.label.startswith("local:") for e in ref_plan.unowned)
    mine = plan_job(_reference_with(constraints={"owned": ["local:workstation-rtx4090-x2"]}))
    ranked = {e.hardware.label for e in mine.options if e.hardware.label.startswith("local:")}
    assert ranked == {"local:workstation-rtx4090-x2"}
    assert "local:workstation-rtx4090-x2" not in {e.hardware.label for e in mine.unowned}
    # the box the user has now competes on its amortised cost; it was cheaper than most rentals all along
    rank_of = next(i for i, e in enumerate(mine.options) if e.hardware.label == "local:workstation-rtx4090-x2")
    assert rank_of < len(mine.options) // 10


def test_an_unknown_owned_machine_is_one_clear_error() -> None:
    with pytest.raises(SpecError, match=r"'workstation-rtx4090-x3' is not a local instance.*did you mean 'local:workstation-rtx4090-x2'") as exc:
        plan_job(_reference_with(constraints={"owned": ["local:workstation-rtx4090-x3"]}))
    assert exc.value.field == "constraints.owned"
    with pytest.raises(SpecError, match="not owned hardware"):
        _reference_with(constraints={"owned": ["aws:p4d.24xlarge"]})


def test_a_plan_only_owned_hardware_could_run_says_so() -> None:
    job = _reference_with(constraints={"clouds": ["local"]})
    with pytest.raises(InfeasibleError, match="add it to constraints.owned") as exc:
        require_options(plan_job(job), job)
    assert exc.value.field == "constraints.owned"


@pytest.mark.parametrize("knobs, checkpointing, refused", [
    ({"moe_fused_activation": True}, "none", "method: lora"),  # the knob is for experts that train
    ({"recompute_modules": ["moe_act"]}, "selective", "activation_checkpointing: full"),  # it needs selective
])
def test_a_remedy_the_jobs_own_knobs_refuse_is_not_offered_and_does_not_abort_the_plan(knobs, checkpointing, refused) -> None:
    """`plan` tries changes to the job (full checkpointing, LoRA) to say what would make a rejected option fit; a change
    the job's knobs refuse used to raise out of the whole plan ("error: knobs.…") — it is now skipped."""
    from trainplan.planner.core import hint_remedies, job_profile

    job = parse_job({"kind": "transformer", "name": "oss", "model": "gpt-oss-20b", "seq_len": 4096, "micro_batch": 2,
                     "global_batch": 256, "precision": "bf16-pure", "steps": 10, "activation_checkpointing": checkpointing,
                     "knobs": knobs, "constraints": {"clouds": ["aws"]}})  # fmt: skip
    cat = get_catalog()
    labels = [label for label, _, _ in hint_remedies(job, cat, job_profile(job, cat))]
    assert not any(label.startswith(refused) for label in labels)  # (moe_act refuses LoRA too: possibly none left)
    plan = plan_job(job)
    assert plan.options and plan.rejected
    hints = " ".join(e.hint or "" for e in plan.rejected)
    assert refused not in hints
