"""The tabular estimator: rows per fold, and the inverse used to calibrate it from a measured fit."""

from __future__ import annotations

import pytest

from trainplan import get_catalog, parse_job
from trainplan.estimate.tabular import estimate_tabular, fit_rows, measured_ns_per_cell
from trainplan.planner.local import local_cpu_hardware

LIBRARIES = ("xgboost", "lightgbm", "catboost", "sklearn-hgb", "sklearn-rf", "sklearn-linear")


def _job(**fields):
    base = {"kind": "tabular", "library": "xgboost", "rows": 100_000, "features": 20, "trees": 100, "max_depth": 6}
    return parse_job(base | fields)


@pytest.mark.parametrize("rows,folds,expected", [(1000, 1, 1000), (1000, 4, 750), (10, 5, 8), (7, 2, 3)])
def test_a_fold_trains_on_k_minus_one_of_k_parts(rows, folds, expected) -> None:
    assert fit_rows(_job(rows=rows, cv_folds=folds)) == expected


def test_four_fold_cv_on_one_core_costs_three_full_fits() -> None:
    cat = get_catalog()
    one_core = local_cpu_hardware(1)
    single = estimate_tabular(_job(library="sklearn-hgb", cv_folds=1), one_core, cat)
    cv = estimate_tabular(_job(library="sklearn-hgb", cv_folds=4), one_core, cat)
    assert cv.train_s == pytest.approx(3 * single.train_s)  # 4 fits on 3/4 of the rows each
    assert cv.throughput == pytest.approx(single.throughput)  # training rows per second do not change


@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_with_split_scans_four_folds_cost_between_three_and_four_fits(library) -> None:
    """Histograms, row passes and binning scale with a fold's rows (×3 over four folds of 3/4); the split scans of
    each node (features × bins) do not (×4)."""
    cat = get_catalog()
    one_core = local_cpu_hardware(1)
    single = estimate_tabular(_job(library=library, cv_folds=1), one_core, cat)
    cv = estimate_tabular(_job(library=library, cv_folds=4), one_core, cat)
    assert 3 * single.train_s < cv.train_s < 4 * single.train_s


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("cores,folds", [(1, 1), (8, 4), (16, 5), (6, 3)])
def test_measured_rate_inverts_the_estimate(library, cores, folds) -> None:
    """A fit taking exactly the predicted time implies exactly the rate the prediction used."""
    cat = get_catalog()
    job = _job(library=library, cv_folds=folds)
    e = estimate_tabular(job, local_cpu_hardware(cores), cat, ns_per_cell=3.7)
    parallel = int(e.time_breakdown["parallel_fits"])
    rounds = job.iterations if library == "sklearn-linear" else job.trees
    rate = measured_ns_per_cell(
        job, cat, rows=fit_rows(job), rounds=rounds, fit_s=e.time_breakdown["fit_s"], threads=cores // parallel
    )
    assert rate == pytest.approx(3.7)
    assert e.calibrated


def test_a_fit_with_more_threads_implies_a_slower_core_than_the_same_time_on_one() -> None:
    cat = get_catalog()
    job = _job()
    one = measured_ns_per_cell(job, cat, rows=75_000, rounds=100, fit_s=10.0, threads=1)
    four = measured_ns_per_cell(job, cat, rows=75_000, rounds=100, fit_s=10.0, threads=4)
    from trainplan.estimate.tabular import thread_overhead_s

    rate = cat.tabular_rates[("xgboost", "cpu")]
    serial, sync = rate.serial_fraction, thread_overhead_s(job, rate, 4, rounds=100)
    # Amdahl over what is left after the threads' synchronisation: 4 threads do 1 / (s + (1 − s)/4) of one's work
    assert four == pytest.approx(one * (10.0 - sync) / 10.0 / (serial + (1 - serial) / 4))
    assert one < four < 4 * one
    hgb = _job(library="sklearn-hgb")  # one rate per cell: half the rounds in the same time is twice the rate
    one = measured_ns_per_cell(hgb, cat, rows=75_000, rounds=100, fit_s=10.0, threads=1)
    assert measured_ns_per_cell(hgb, cat, rows=75_000, rounds=50, fit_s=10.0, threads=1) == pytest.approx(2 * one)
    # XGBoost's binning is once per fit: half the rounds is less than half the work, so less than twice the rate
    half = measured_ns_per_cell(job, cat, rows=75_000, rounds=50, fit_s=10.0, threads=1)
    assert 1.2 * measured_ns_per_cell(job, cat, rows=75_000, rounds=100, fit_s=10.0, threads=1) < half


def test_each_parallel_fit_holds_its_fold_and_the_library_copy() -> None:
    cat = get_catalog()
    machine = local_cpu_hardware(4)
    xgb = estimate_tabular(_job(cv_folds=4), machine, cat)
    lgbm = estimate_tabular(_job(library="lightgbm", cv_folds=4), machine, cat)
    training_cells = fit_rows(_job(cv_folds=4)) * 20
    assert xgb.time_breakdown["parallel_fits"] == lgbm.time_breakdown["parallel_fits"] == 4
    # XGBoost's DMatrix keeps 8 bytes per cell (CSR entry); LightGBM bins from the caller's array
    assert xgb.memory.activations - lgbm.memory.activations == pytest.approx(4 * 8 * training_cells)
    one_at_a_time = estimate_tabular(_job(cv_folds=4), local_cpu_hardware(1), cat)
    # three fewer fits in memory at once: each held a float32 fold copy, the DMatrix, bins and gradients
    assert xgb.memory.activations - one_at_a_time.memory.activations >= 3 * (4 + 8 + 1) * training_cells


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_step_is_one_round_trees_or_linear_solver_iterations(library) -> None:
    """``trainplan run`` counts a step as one boosting round — a tree, or one solver iteration for
    ``sklearn-linear`` (``max_iter=iterations``); the estimate's steps and step time must count the same."""
    job = _job(library=library, trees=30, iterations=70, cv_folds=3)
    e = estimate_tabular(job, local_cpu_hardware(4), get_catalog())
    rounds = 70 if library == "sklearn-linear" else 30
    assert e.steps == rounds * 3
    assert e.step_time_s == pytest.approx(e.time_breakdown["fit_s"] / rounds)


def _gpu_hardware(instance: str):  # noqa: ANN202
    from trainplan.catalog import find_instance
    from trainplan.estimate.hardware import hardware_for_instance

    cat = get_catalog()
    return hardware_for_instance(find_instance(instance, cat), cat)


@pytest.mark.parametrize("max_bins,bits", [(256, 8), (255, 8), (257, 9), (64, 6), (65536, 16)])
def test_xgboost_gpu_matrix_packs_each_bin_index_into_its_bits(max_bins: int, bits: int) -> None:
    """XGBoost >= 3.0 keeps a dense matrix as feature-local bin indices of ceil(log2 max_bins) bits (no null)."""
    from trainplan.estimate.tabular import GIB, gpu_memory_bytes

    cat = get_catalog()
    one = gpu_memory_bytes(_job(rows=1_000_000, features=50, max_bins=max_bins), cat)
    two = gpu_memory_bytes(_job(rows=2_000_000, features=50, max_bins=max_bins), cat)
    # doubling the rows adds one more matrix and one more set of per-row state; histograms and context stay
    per_million = (two.peak - one.peak) - (two.gradients - one.gradients)
    assert per_million == pytest.approx(1_000_000 * 50 * bits / 8)
    assert two.gradients - one.gradients == 1_000_000 * (8 + 4 + 4 + 8)  # gradient pair, prediction, label, 2 indices
    assert one.context == pytest.approx(cat.assumption("cuda_context_gib") * GIB)


def test_a_gpu_option_is_judged_by_gpu_memory_and_host_ram_apart() -> None:
    """The option's memory is the GPU's (verdict and margin like any job); host RAM is checked on its own."""
    cat = get_catalog()
    hw = _gpu_hardware("p3.2xlarge")  # one V100-16GB, 61 GiB RAM
    small = estimate_tabular(_job(rows=10_000_000, features=100), hw, cat)
    assert small.fits and small.capacity_gib == hw.accelerator.memory_gib
    assert small.memory.peak < 4 * 2**30 and any("host RAM" in n for n in small.notes)
    # 150M x 100 dense cells: 14 GiB of bins and 3.4 GiB of per-row state do not fit 16 GB; the reason says so
    big = estimate_tabular(_job(rows=150_000_000, features=100), hw, cat)
    assert not big.fits and big.rejection.kind.value == "device-memory"
    assert "GPU memory" in big.rejection.text and "external memory" in big.rejection.text
    # the same rows on a CPU instance are judged by host RAM as before
    cpu = estimate_tabular(_job(rows=10_000_000, features=100), _gpu_hardware("c5.4xlarge"), cat)
    assert cpu.capacity_gib == _gpu_hardware("c5.4xlarge").ram_gib_per_node


def test_catboost_levels_each_visit_every_row() -> None:
    """Oblivious trees score one split per level over all rows: work grows with depth in proportion, where a
    histogram GBDT's grows by half a pass per level (sibling subtraction)."""
    from trainplan.estimate.tabular import work_cells

    cb = [work_cells(_job(library="catboost", max_depth=d)) for d in (4, 8)]
    xgb = [work_cells(_job(library="xgboost", max_depth=d)) for d in (4, 8)]
    assert cb[1] == pytest.approx(2 * cb[0])
    assert xgb[1] / xgb[0] == pytest.approx(4.5 / 2.5)
    assert cb[0] == 100_000 * 20 * 4 * 100
    # multiclass: the work scales with the gradient's dimensions
    assert work_cells(_job(library="catboost", objective="multiclass", classes=3)) == pytest.approx(
        3 * work_cells(_job(library="catboost")))


def test_catboost_is_planned_on_cpus_and_gpus() -> None:
    from trainplan.planner.core import plan_job

    plan = plan_job(_job(library="catboost", rows=5_000_000, features=50, trees=500), get_catalog(), hints=False)
    kinds = {e.strategy for e in plan.options}
    assert kinds == {"cpu", "gpu"}


def test_xgboost_trains_one_model_over_a_nodes_gpus_through_dask() -> None:
    """An 8-GPU instance: the rows split over 8 workers (memory per GPU an eighth of the matrix), the time an eighth
    of one GPU's plus the histogram all-reduce of every round; the libraries without a multi-GPU path still idle."""
    from trainplan.estimate.tabular import GIB, histogram_allreduce_bytes

    cat = get_catalog()
    job = _job(rows=20_000_000, features=100, trees=500, max_depth=8)
    eight = estimate_tabular(job, _gpu_hardware("p4d.24xlarge"), cat)  # 8 x A100-40GB
    single = estimate_tabular(job, _gpu_hardware("a2-highgpu-1g"), cat)  # one A100-40GB
    assert eight.strategy == "dask-gpu" and single.strategy == "gpu"
    assert eight.fits and single.fits
    sync = eight.time_breakdown["fit_s"] - single.time_breakdown["fit_s"] / 8
    assert sync > 0 and any("all-reduce" in n for n in eight.notes)
    assert single.time_breakdown["fit_s"] / eight.time_breakdown["fit_s"] < 8
    # the 1-byte-a-cell matrix splits over the 8 workers; the histograms do not
    assert single.memory.activations - eight.memory.activations == pytest.approx(20_000_000 * 100 * 7 / 8)
    # depth 8: the root, then half of each level's nodes, every bin of every feature, 16 bytes
    assert histogram_allreduce_bytes(job) == (1 + 1 + 2 + 4 + 8 + 16 + 32 + 64) * 100 * 256 * 16
    assert eight.memory.context == pytest.approx(cat.assumption("cuda_context_gib") * GIB)
    lgb = estimate_tabular(_job(library="lightgbm", rows=50_000_000, features=100), _gpu_hardware("p4d.24xlarge"), cat)
    assert not lgb.fits and lgb.rejection.kind.value == "waste"


def test_every_published_tabular_record_builds_and_estimates() -> None:
    """benchmarks/validate_tabular.py reads every record of tests/data/published_tabular.yaml: each one the estimator
    covers becomes a job on its named hardware and gets a time or a GPU memory figure."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("validate_tabular", root / "benchmarks" / "validate_tabular.py")
    validator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(validator)
    import yaml

    cat = get_catalog()
    covered = 0
    for rec in yaml.safe_load(validator.DATA.read_text()):
        if validator.skip_reason(rec):
            continue
        e = estimate_tabular(validator.job_of(rec), validator.hardware_of(rec, cat), cat)
        assert e.train_s > 0, rec["id"]
        covered += 1
    assert covered >= 30


def test_catboost_depth_beyond_its_limit_is_one_clear_error() -> None:
    """CatBoost trains symmetric trees up to depth 16; the job says so before anything runs (num_leaves maps to depth)."""
    from trainplan.errors import SpecError

    with pytest.raises((SpecError, ValueError), match="at most 16 deep"):
        _job(library="catboost", max_depth=17)
    with pytest.raises((SpecError, ValueError), match="at most 16 deep"):
        _job(library="catboost", max_depth=None, num_leaves=2**20)
    assert _job(library="catboost", max_depth=None, num_leaves=255).depth == 8


@pytest.mark.parametrize("library", ["xgboost", "lightgbm", "catboost"])
def test_the_thread_model_is_the_published_thread_scaling_fit(library) -> None:
    """tabular_rates.csv's serial fraction and per-node thread overhead are the fit of benchmarks/tabular_thread_scaling.py
    to GBM-perf's published runs — XGBoost and LightGBM on 1-48 cores of a c7i metal, CatBoost on 1-24 of a c5
    metal —, not stated constants."""
    import importlib.util
    import sys
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "tabular_thread_scaling.py"
    spec = importlib.util.spec_from_file_location("tabular_thread_scaling", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["tabular_thread_scaling"] = module
    spec.loader.exec_module(module)
    if library == "catboost":
        s, c = module.fit(yaml.safe_load(module.DATA_C5.read_text(encoding="utf-8")), library, module.FIT_ON_C5)
    else:
        s, c = module.fit(yaml.safe_load(module.DATA.read_text(encoding="utf-8")), library)
    rate = get_catalog().tabular_rates[(library, "cpu")]
    assert rate.serial_fraction == pytest.approx(s, abs=0.001)
    assert rate.thread_overhead_us_per_node == pytest.approx(c, abs=0.001)


def test_more_threads_make_a_small_lightgbm_table_slower() -> None:
    """GBM-perf's 100k-row LightGBM runs take longer on 48 cores than on 2: the per-node thread overhead outgrows
    the divided work, and the estimate says so."""
    cat = get_catalog()
    job = _job(library="lightgbm", rows=100_000, features=8, num_leaves=512, max_depth=None)
    t = {n: estimate_tabular(job, local_cpu_hardware(n), cat).train_s for n in (1, 2, 48)}
    assert t[2] < t[1] and t[48] > t[2]
    big = _job(library="lightgbm", rows=10_000_000, features=8, num_leaves=512, max_depth=None)
    assert estimate_tabular(big, local_cpu_hardware(48), cat).train_s < estimate_tabular(big, local_cpu_hardware(2), cat).train_s


@pytest.mark.parametrize("library", ["xgboost", "lightgbm", "catboost"])
def test_the_gpu_fixed_cost_is_the_published_small_table_runs(library) -> None:
    """tabular_rates.csv's gpu_fixed_us_per_step is benchmarks/tabular_gpu_fixed.py's median over GBM-perf's 2024
    100k-row GPU runs; a GPU estimate carries it per level (a split for LightGBM) and round."""
    import importlib.util
    import sys
    from pathlib import Path

    import yaml

    from trainplan.estimate.tabular import gpu_steps

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "tabular_gpu_fixed.py"
    spec = importlib.util.spec_from_file_location("tabular_gpu_fixed", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["tabular_gpu_fixed"] = module
    spec.loader.exec_module(module)
    cat = get_catalog()
    data = yaml.safe_load(module.DATA.read_text(encoding="utf-8"))
    rate = cat.tabular_rates[(library, "gpu")]
    assert rate.gpu_fixed_us_per_step == pytest.approx(module.fixed_us(data, library, cat), rel=0.01)
    job = module.job(library, "0.1")
    e = estimate_tabular(job, module.gpu_hardware("A100-40GB", cat), cat)
    assert e.time_breakdown["gpu_fixed_s"] == pytest.approx(rate.gpu_fixed_us_per_step * 1e-6 * gpu_steps(job))
    assert gpu_steps(job) == (511 if library == "lightgbm" else 10) * 100


def test_catboost_categorical_columns_cost_their_measured_work() -> None:
    """benchmarks/tabular_catboost_categorical.py: per row and tree, a part for any categorical column and a part per
    column, beyond what the same columns cost as numbers (tabular_rates.csv, in the rate's cells)."""
    from trainplan.estimate.tabular import categorical_cells, work_cells

    cat = get_catalog()
    rate = cat.tabular_rates[("catboost", "cpu")]
    numeric = _job(library="catboost")
    mixed = _job(library="catboost", categorical_features=6)
    rows, trees = fit_rows(mixed), 100
    extra = work_cells(mixed, rate=rate) - work_cells(numeric, rate=rate)
    assert extra == pytest.approx(rows * trees * (rate.categorical_cells_per_row_tree + 6 * rate.categorical_cells_per_column_row_tree))
    assert categorical_cells(numeric, rate, rows=rows, rounds=trees) == 0.0
    one_core = local_cpu_hardware(1)
    assert estimate_tabular(mixed, one_core, cat).train_s > 2 * estimate_tabular(numeric, one_core, cat).train_s
    # the GPU rate comes from GBM-perf's airline runs, 6 of 8 columns categorical: that work is inside it already
    gpu_rate = cat.tabular_rates[("catboost", "gpu")]
    assert categorical_cells(mixed, gpu_rate, rows=rows, rounds=trees) == 0.0


def test_categorical_columns_are_catboost_s_and_at_most_the_features() -> None:
    from trainplan.errors import SpecError

    for fields, words in (({"library": "xgboost", "categorical_features": 2}, "one-hot encode them"),
                          ({"library": "catboost", "categorical_features": 21}, "more than the job's 20 features")):
        with pytest.raises(SpecError) as err:
            _job(**fields)
        assert words in str(err.value) and "categorical_features" in f"{err.value.field} {err.value}"


def _releases(library: str) -> list:
    from trainplan.catalog.loader import release_key

    cat = get_catalog()
    return sorted((r for (lib, _), r in cat.tabular_releases.items() if lib == library), key=lambda r: release_key(r.release))


@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_a_named_release_is_priced_by_its_measured_terms(library) -> None:
    """library_version: each cost term of the CPU rate scaled by that release's measured factor (tabular_releases.csv);
    the rates' own release prices as no release named; the estimate says which release priced it."""
    cat = get_catalog()
    hw = local_cpu_hardware(4)
    base = estimate_tabular(_job(library=library), hw, cat)
    releases = _releases(library)
    assert len(releases) >= 3 and releases[-1].dense_cell_factor == 1.0  # the rates' own release is the newest row
    same = estimate_tabular(_job(library=library, library_version=releases[-1].release), hw, cat)
    assert same.train_s == pytest.approx(base.train_s)
    for r in releases[:-1]:
        e = estimate_tabular(_job(library=library, library_version=r.release), hw, cat)
        factors = (r.dense_cell_factor, r.sparse_cell_factor, r.split_bin_factor, r.row_level_factor, r.prep_factor)
        # compute time scales by a mix of the term factors; the thread synchronisation is not scaled
        sync = base.time_breakdown.get("thread_sync_s", 0.0)
        ratio = (e.time_breakdown["fit_s"] - sync) / (base.time_breakdown["fit_s"] - sync)
        assert min(factors) - 1e-9 <= ratio <= max(factors) + 1e-9
        assert any(f"{library} {r.release} priced by its measured time per term" in n for n in e.notes)


def test_a_release_between_two_measured_takes_the_older_one_and_one_before_all_is_refused() -> None:
    from trainplan.errors import CatalogError

    cat = get_catalog()
    hw = local_cpu_hardware(2)
    older, newer = _releases("xgboost")[:2]
    major, minor, patch = (older.release.split(".") + ["0"])[:3]
    between = f"{major}.{minor}.{int(patch) + 1}"
    assert between != newer.release
    e = estimate_tabular(_job(library_version=between), hw, cat)
    assert e.train_s == pytest.approx(estimate_tabular(_job(library_version=older.release), hw, cat).train_s)
    assert any(f"priced by {older.release}'s (the nearest measured release below it)" in n for n in e.notes)
    with pytest.raises(CatalogError, match=r"library_version: xgboost 0\.1 is older than every measured release"):
        estimate_tabular(_job(library_version="0.1"), hw, cat)
    # calibrated: the measured rate is of the installed release; the named one is said, not applied
    c = estimate_tabular(_job(library_version=older.release), hw, cat, ns_per_cell=3.0)
    assert c.train_s == pytest.approx(estimate_tabular(_job(), hw, cat, ns_per_cell=3.0).train_s)
    assert any("not applied" in n for n in c.notes)


@pytest.mark.parametrize(
    "fields,needle",
    [({"library_version": "latest"}, "must be a release number like 1.7.6, got 'latest'"),
     ({"library_version": "1.7.6; rm -rf /"}, "must be a release number"),
     ({"library": "catboost", "library_version": "1.2.10"}, "releases are measured for xgboost and lightgbm only")],
)  # fmt: skip
def test_bad_library_version_is_one_line_naming_the_field(fields, needle) -> None:
    from trainplan.errors import SpecError

    with pytest.raises(SpecError) as info:
        _job(**fields)
    assert "library_version" in str(info.value) and needle in str(info.value) and "\n" not in str(info.value)


def test_run_refuses_a_job_naming_another_release_than_the_installed_one() -> None:
    import xgboost

    from trainplan.errors import SpecError
    from trainplan.run.api import check_library_release

    installed = xgboost.__version__
    check_library_release(_job(library_version=".".join(installed.split(".")[:2])))  # the same major.minor runs
    with pytest.raises(SpecError, match=f"names xgboost 0.90 but {installed} is installed"):
        check_library_release(_job(library_version="0.90"))


def test_a_bad_release_row_is_refused_with_its_file_line_and_column(tmp_path) -> None:
    import csv
    import shutil

    from trainplan.catalog import DATA_DIR, load_catalog

    for f in DATA_DIR.iterdir():
        if f.is_file():
            shutil.copy(f, tmp_path / f.name)
    path = tmp_path / "tabular_releases.csv"
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header, first = reader.fieldnames, next(reader)
    for column, value, message in (("release", "one", "must be a release number"), ("prep_factor", "0", "must be > 0")):
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header)
            writer.writeheader()
            writer.writerow(first | {column: value})
        issues = [str(i) for i in load_catalog(tmp_path).issues]
        assert any(i.startswith(f"tabular_releases.csv:2: {column}: {message}") for i in issues), issues


@pytest.mark.parametrize("library", ["xgboost", "lightgbm", "catboost"])
def test_gpu_rates_scale_by_streaming_multiprocessors_where_the_catalog_has_them(library) -> None:
    """The histogram work on a GPU scales by the SMs against the rate's reference GPU (estimate/tabular.py
    gpu_ns_per_cell: shared-memory atomic histograms), by memory bandwidth where a GPU has no SM count (AMD), and the
    estimate says which."""
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.estimate.tabular import gpu_ns_per_cell

    cat = get_catalog()
    rate = cat.tabular_rates[(library, "gpu")]
    assert rate.ref_sm_count == 28  # the GTX 1080 Ti of XGBoost's GPU benchmark, the rate's reference
    job = parse_job({"kind": "tabular", "library": library, "rows": 10_000_000, "features": 28, "trees": 100})
    for acc in (cat.accelerators[a] for a in ("H100-PCIe", "A100-40GB", "L4", "A10G", "MI300X")):
        ns, how = gpu_ns_per_cell(rate, acc)
        if acc.sm_count:
            assert ns == pytest.approx(rate.ns_per_cell * 28 / acc.sm_count) and "SM count" in how
        else:
            assert ns == pytest.approx(rate.ns_per_cell * rate.ref_mem_bandwidth_gb_s / acc.mem_bandwidth_gb_s)
            assert "memory bandwidth" in how
        if acc.id != "H100-PCIe":  # no catalog instance carries it
            e = estimate_tabular(job, hardware_for_gpu(acc, cat, gpus=1), cat)
            # CatBoost's GPU trainer has no ROCm build: rejected on an AMD GPU, with no rate to scale
            assert any(how in note for note in e.notes) or (library == "catboost" and acc.vendor == "amd" and e.rejection)
    l4, h100 = cat.accelerators["L4"], cat.accelerators["H100-PCIe"]
    # an L4 has a seventh of an H100 PCIe's bandwidth but half its SMs: its histograms take about twice as long
    assert gpu_ns_per_cell(rate, l4)[0] / gpu_ns_per_cell(rate, h100)[0] == pytest.approx(h100.sm_count / l4.sm_count)
    assert h100.sm_count / l4.sm_count < 2.5 < h100.mem_bandwidth_gb_s / l4.mem_bandwidth_gb_s
