"""Time and memory of classical ML training (GBDT, random forest, linear models).

Units of work ("cells"), one pure function each:

* Histogram GBDT (XGBoost ``hist``, LightGBM, scikit-learn HistGradientBoosting):
  building the gradient histograms dominates (Chen & Guestrin 2016, "XGBoost",
  Sec. 4.1; Ke et al. 2017, "LightGBM", Sec. 2).  Each tree visits every
  (row, feature) once at the root; below it only the smaller child of each
  split is built and its sibling is obtained by subtraction, so each further
  level visits about half the rows: cells per tree = rows · features ·
  (1 + (depth − 1)/2).  Multiclass objectives grow one tree per class per round.
* Random forest (scikit-learn, Breiman 2001): each split sorts the node's
  samples on ``max_features`` = √features candidates: cells per tree = rows ·
  √features · depth · log2(rows).
* Linear models (L-BFGS logistic regression): two passes over the data per
  iteration (loss and gradient): cells = 2 · rows · features · iterations.

``rows`` is the rows one fit trains on: (k − 1)/k of the data with k-fold
cross-validation (:func:`fit_rows`).

Time = cells × (ns per cell per core) / cores_eff, where the per-core rates
and serial fractions are data (``tabular_rates.csv``, each row with its
source) and cores_eff follows Amdahl's law over physical cores (vCPUs / 2 on
x86 cloud instances: the second hyper-thread adds little to these
memory-bound loops — LightGBM docs, "Parameters: num_threads").
GPU rates are scaled by the GPU's streaming multiprocessors relative to the GPU
they were measured on (:func:`gpu_ns_per_cell`), or by memory bandwidth where the
catalog has no SM count.
"""

from __future__ import annotations

import math
from dataclasses import replace

from trainplan.catalog import Catalog
from trainplan.catalog.loader import Accelerator, TabularRate, TabularRelease, release_key
from trainplan.errors import CatalogError
from trainplan.estimate.memory import GIB, MemoryBreakdown
from trainplan.estimate.result import Estimate, Hardware, Rejection, RejectKind, job_timing
from trainplan.spec import TabularJob, TabularLibrary

GBDT = (TabularLibrary.XGBOOST, TabularLibrary.LIGHTGBM, TabularLibrary.CATBOOST, TabularLibrary.SKLEARN_HGB)
GPU_LIBRARIES = (TabularLibrary.XGBOOST, TabularLibrary.LIGHTGBM, TabularLibrary.CATBOOST)
# one model over several GPUs of a node: xgboost.dask, one worker per GPU (XGBoost docs "Distributed XGBoost with
# Dask", GPU section: one worker per GPU with dask_cuda's LocalCUDACluster)
MULTI_GPU_LIBRARIES = (TabularLibrary.XGBOOST,)
# GPU trainers with a ROCm build for AMD Instinct GPUs: AMD's ports in its ROCm Finance toolkit, pip packages
# amd_xgboost and amd_lightgbm from pypi.amd.com (rocm.docs.amd.com/projects/xgboost and /lightgbm, "Install with
# pip", 2026); CatBoost's GPU trainer has none that was found
ROCM_LIBRARIES = (TabularLibrary.XGBOOST, TabularLibrary.LIGHTGBM)
# one model over several CPU machines, data parallel: xgboost.dask and LightGBM's Dask estimators (one worker a node)
MULTI_NODE_LIBRARIES = (TabularLibrary.XGBOOST, TabularLibrary.LIGHTGBM)
#: CPU machines a multi-node tabular option is planned on, at most: LightGBM's published data-parallel run stops at 16
#: (docs/Experiments.rst, Criteo), and no published XGBoost / LightGBM run beyond it was found to check the model on.
MAX_TABULAR_NODES = 16


def gbdt_cells(*, rows: int, features: int, depth: int, trees: int, classes: int = 1) -> float:
    """Histogram cells visited by ``trees`` boosting rounds (subtraction trick below the root)."""
    per_tree = rows * features * (1 + (depth - 1) / 2)
    return per_tree * trees * classes


def gbdt_terms(library: str, rows: int, features: int, density: float, *, leaves: float,
               max_bins: int = 256) -> tuple[float, float, float, float]:
    """The four per-tree terms of a histogram GBDT round (XGBoost ``hist``, LightGBM), each in its own unit:

    * histogram cells of dense data and, apart, of sparse data — only the stored values of a sparse matrix are
      visited (XGBoost: "sparsity-aware split finding ... linear to the number of non-missing entries", Chen &
      Guestrin 2016, Sec. 3.4; LightGBM: histograms of sparse features built from their non-zero entries, Ke et
      al. 2017, Sec. 4) — rows · features · density · (1 + (levels − 1)/2) with the subtraction trick, counted apart
      because a sparse row-wise pass costs more per value than a dense one (measured:
      ``benchmarks/tabular_terms.py``);
    * split scans: every node's histogram is scanned bin by bin for the best split (Ke et al. 2017, Alg. 1: "O(#bin
      × #feature)" per leaf): nodes · features · bins, with bins = min(max_bins, stored values per feature + 1);
    * row passes: gradients, the row partition and the prediction update touch every row once per level:
      rows · (levels + 1).

    ``leaves`` is the tree's leaf count (the planner assumes full trees: 2^depth, or num_leaves); nodes scanned =
    2 · leaves − 1, levels = log2(leaves).  The rates of each term are per library (tabular_rates.csv)."""
    levels = math.log2(max(2.0, leaves))
    hist = rows * features * density * (1 + (levels - 1) / 2)
    bins = min(float(max_bins), rows * density + 1)
    return (hist if density >= 1 else 0.0, hist if density < 1 else 0.0, (2 * leaves - 1) * features * bins,
            rows * (levels + 1))


def oblivious_cells(*, rows: int, features: int, depth: int, trees: int, classes: int = 1) -> float:
    """CatBoost's oblivious (symmetric) trees: every level chooses one split for all its leaves, scored over every
    row's histogram contribution (Prokhorenkova et al. 2018, "CatBoost: unbiased boosting with categorical
    features", Sec. 6 and App.; CatBoost docs, "Tree growing policy: SymmetricTree"), so each of the ``depth``
    levels visits rows × features.  Whether CatBoost also derives sibling histograms by subtraction is not
    modelled: the measured per-cell rate absorbs that constant."""
    return rows * features * depth * trees * classes


def categorical_cells(job: TabularJob, rate: TabularRate | None, *, rows: int, rounds: int) -> float:
    """CatBoost's work for the job's categorical columns beyond what as many numeric columns cost, in the rate's
    cells: ordered target statistics computed on permutations of the rows for each categorical column, and for the
    combinations of categorical columns the growing trees choose (Prokhorenkova et al. 2018, Sec. 3.2-3.3; CatBoost
    docs, "Transforming categorical features to numerical features").  Measured per training row and tree as a part
    for any categorical column plus a part per column (``benchmarks/tabular_catboost_categorical.py``;
    tabular_rates.csv).  Zero without categorical columns."""
    if not job.categorical_features:
        return 0.0
    if rate is None or rate.categorical_cells_per_row_tree is None or rate.categorical_cells_per_column_row_tree is None:
        raise CatalogError(f"tabular_rates.csv has no categorical-column rate for {job.library.value} "
                           f"({'no rate' if rate is None else rate.device}): categorical_features cannot be priced")  # fmt: skip
    per_row_tree = rate.categorical_cells_per_row_tree + rate.categorical_cells_per_column_row_tree * job.categorical_features
    return rows * rounds * per_row_tree


def forest_cells(*, rows: int, features: int, depth: int, trees: int) -> float:
    """Sort-based split search on √features candidates per level."""
    mtry = max(1, round(math.sqrt(features)))
    levels = min(depth, max(1, math.ceil(math.log2(rows))))
    return trees * rows * mtry * levels * math.log2(max(2, rows))


def linear_cells(*, rows: int, features: int, iterations: int) -> float:
    """Two data passes per L-BFGS iteration."""
    return 2.0 * rows * features * iterations


def amdahl_speedup(cores: float, serial_fraction: float) -> float:
    """Amdahl's law: 1 / (s + (1 − s)/p)."""
    return 1.0 / (serial_fraction + (1.0 - serial_fraction) / max(1.0, cores))


def thread_overhead_s(job: TabularJob, rate: TabularRate, threads: int, *, rounds: int | None = None) -> float:
    """Seconds a fit spends synchronising its threads: ``thread_overhead_us_per_node`` per tree node per thread beyond
    the first (LightGBM's per-split parallel sections; fitted with the serial fraction to GBM-perf's published
    1-48-core runs, benchmarks/tabular_thread_scaling.py).  It is what makes small tables slower on more cores."""
    if not rate.thread_overhead_us_per_node or threads <= 1:
        return 0.0
    rounds = rounds_per_fit(job) if rounds is None else rounds
    nodes = (2 * tree_leaves(job) - 1) * rounds * gradient_dims(job)
    return rate.thread_overhead_us_per_node * 1e-6 * nodes * (threads - 1)


def gpu_ns_per_cell(rate: TabularRate, accelerator: Accelerator) -> tuple[float, str]:
    """A GPU rate on ``accelerator``, and how it was scaled from the GPU it was measured on.

    By the count of streaming multiprocessors: XGBoost's GPU ``hist`` accumulates each node's gradient histogram in
    shared memory with atomic adds, one histogram per thread block on an SM (dmlc/xgboost
    src/tree/gpu_hist/histogram.cu, ``SharedMemHistKernel``), so its throughput follows the SMs rather than DRAM
    bandwidth. Measured on GBM-perf's 2024 runs (tests/data/published_tabular_gpu2024.yaml; python
    benchmarks/tabular_gpu_fixed.py), the time of 10M rows above that of 0.1M (nearly all fixed cost) on an
    A100-40GB / A10G / L4 over an H100 PCIe's: XGBoost 1.01 / 1.55 / 1.59, CatBoost 0.92 / 1.22 / 1.52 (LightGBM
    1.92 / 2.08 / 1.70), against 1.06 / 1.43 / 1.97 in SMs and 1.29 / 3.33 / 6.67 in memory bandwidth. Falls back
    to memory bandwidth where the catalog has no SM count for either GPU (AMD's compute units are not SMs), and says
    so."""
    if rate.ref_sm_count and accelerator.sm_count:
        return (rate.ns_per_cell * rate.ref_sm_count / accelerator.sm_count,
                f"rate scaled by SM count ({accelerator.sm_count} against the reference GPU's {rate.ref_sm_count})")
    return (rate.ns_per_cell * (rate.ref_mem_bandwidth_gb_s or 1) / accelerator.mem_bandwidth_gb_s,
            "rate scaled by memory bandwidth (no SM count in the catalog for this GPU)")


def gpu_steps(job: TabularJob, *, rounds: int | None = None) -> int:
    """Steps of tree growth a GPU fit launches its kernels for: every level of a depth-wise (XGBoost) or symmetric
    (CatBoost) tree, every split of a leaf-wise (LightGBM) one — per round and target."""
    rounds = rounds_per_fit(job) if rounds is None else rounds
    per_tree = tree_leaves(job) - 1 if job.library is TabularLibrary.LIGHTGBM else effective_depth(job)
    return per_tree * rounds * gradient_dims(job)


def physical_cores(vcpus: int, *, cloud: str) -> float:
    """Physical cores behind ``vcpus``: half on x86 cloud instances (2 threads per core); all on a workstation."""
    return vcpus if cloud == "local" else max(1, vcpus // 2)


def effective_depth(job: TabularJob) -> int:
    if job.library is TabularLibrary.SKLEARN_RF and job.max_depth is None:
        return max(1, math.ceil(math.log2(job.rows)))  # grown until pure leaves
    return job.depth


def fit_rows(job: TabularJob) -> int:
    """Rows one fit trains on: k − 1 of k folds with ``cv_folds: k`` ≥ 2, every row with one fold."""
    k = job.cv_folds
    return job.rows if k < 2 else max(1, job.rows * (k - 1) // k)


def rounds_per_fit(job: TabularJob) -> int:
    """Rounds of one fit — the unit of a tabular *step*: trees (boosting rounds, forest trees), or
    solver iterations for ``sklearn-linear`` (its ``max_iter``).  ``trainplan run`` counts the same."""
    return job.iterations if job.library is TabularLibrary.SKLEARN_LINEAR else job.trees


def gradient_dims(job: TabularJob) -> int:
    """Gradient and prediction values per row: one per class for a multiclass objective, else one."""
    return job.classes if job.objective == "multiclass" else 1


#: The unit of a measured CPU rate per library, where it is not the original one ("cell" of gbdt_cells and the
#: others, None): a calibration records it, and one in another unit is not applied.
_WORK_UNITS = {"xgboost": "gbdt-terms-2026-12-05", "lightgbm": "gbdt-terms-2026-12-05"}


def tabular_work_unit(library: str) -> str | None:
    return _WORK_UNITS.get(library)


def tree_leaves(job: TabularJob) -> int:
    """Leaves of a full tree: ``num_leaves`` when given (LightGBM, XGBoost's max_leaves), else 2^depth."""
    return job.num_leaves or 2 ** effective_depth(job)


def work_terms(job: TabularJob, rate: TabularRate, *, rows: int | None = None, rounds: int | None = None) -> dict[str, float]:
    """:func:`work_cells` of a per-term CPU rate split by term, each in dense-histogram-cell equivalents:
    ``histogram`` (dense and sparse cells), ``split_scans``, ``row_passes`` and ``binning`` (once per fit)."""
    rows = fit_rows(job) if rows is None else rows
    rounds = rounds_per_fit(job) if rounds is None else rounds
    dense, sparse, scans, passes = gbdt_terms(job.library.value, rows, job.features, job.density,
                                              leaves=tree_leaves(job), max_bins=job.max_bins)  # fmt: skip
    unit = rate.ns_per_cell
    trees = rounds * gradient_dims(job)
    return {
        "histogram": trees * (dense * unit + sparse * rate.ns_per_sparse_cell) / unit,  # type: ignore[operator]
        "split_scans": trees * scans * rate.ns_per_split_bin / unit,  # type: ignore[operator]
        "row_passes": trees * passes * rate.ns_per_row_level / unit,  # type: ignore[operator]
        "binning": rate.prep_ns_per_cell * rows * job.features * job.density / unit,  # type: ignore[operator]
    }


def work_cells(job: TabularJob, *, rows: int | None = None, rounds: int | None = None,
               rate: TabularRate | None = None) -> float:
    """Units of work of one model fit (one fold) on ``rows`` training rows (default :func:`fit_rows`),
    with ``rounds`` trees (iterations for a linear model) instead of the job's :func:`rounds_per_fit`.

    With a CPU ``rate`` that has the per-term rates (XGBoost, LightGBM), the unit is the dense histogram cell and
    the work is the four terms of :func:`gbdt_terms` per tree plus the data preparation once per fit, each weighted
    by its rate relative to the dense cell's; otherwise histogram cells of the stored values."""
    rows = fit_rows(job) if rows is None else rows
    rounds = rounds_per_fit(job) if rounds is None else rounds
    classes = gradient_dims(job)
    if job.library is TabularLibrary.CATBOOST:
        cells = oblivious_cells(rows=rows, features=job.features, depth=effective_depth(job), trees=rounds, classes=classes)
        return cells + categorical_cells(job, rate, rows=rows, rounds=rounds)
    if job.library in GBDT:
        if rate is not None and rate.has_terms:
            return sum(work_terms(job, rate, rows=rows, rounds=rounds).values())
        cells = gbdt_cells(rows=rows, features=job.features, depth=effective_depth(job), trees=rounds, classes=classes)
        return cells * job.density
    if job.library is TabularLibrary.SKLEARN_RF:
        return forest_cells(rows=rows, features=job.features, depth=effective_depth(job), trees=rounds)
    return linear_cells(rows=rows, features=job.features, iterations=rounds) * classes


def measured_ns_per_cell(
    job: TabularJob, catalog: Catalog, *, rows: int, rounds: int, fit_s: float, threads: int
) -> float:
    """The per-core rate one measured CPU fit implies — the inverse of :func:`estimate_tabular`.

    ``fit_s`` seconds for one fit on ``rows`` training rows and ``rounds``
    trees (iterations) with ``threads`` library threads; the result is in the unit of
    ``tabular_rates.csv`` (ns per cell on one core), so a calibration replaces
    the catalog's rate one for one.
    """
    rate = _rate(catalog, job.library, "cpu")
    compute_s = max(0.0, fit_s - thread_overhead_s(job, rate, threads, rounds=rounds))
    return compute_s * 1e9 * amdahl_speedup(threads, rate.serial_fraction) / work_cells(job, rows=rows, rounds=rounds, rate=rate)


def library_copy_bytes(job: TabularJob, catalog: Catalog) -> float:
    """Bytes per training cell the library holds beside the caller's array (assumptions.yaml, with sources)."""
    entry = catalog.assumptions["tabular_library_copy_bytes"]
    return float(entry.get("by_library", {}).get(job.library.value, entry["value"]))


def host_memory_bytes(job: TabularJob, parallel_fits: int, *, copy_bytes: float) -> MemoryBreakdown:
    """RAM of a tabular fit: the data (float32); per parallel fit the fold's training rows (a float32 copy:
    ``X[train]`` is advanced indexing, which always copies — NumPy manual, "Indexing on ndarrays"), the
    library's own copy of them (``copy_bytes`` per cell), the binned copy (1 byte/cell with ≤ 256 bins),
    gradient pairs and predictions, histograms per thread, and the trees (RF).

    Sparse input (``density`` < 1) is a CSR matrix: per stored value a float32 and an int32 column index, per row an
    int32 offset (SciPy's csr_matrix with int32 indices); the libraries' copies and bins count stored values, the
    bins as 4-byte global bin ids (an assumption: a sparse quantised matrix cannot use per-feature 1-byte offsets)."""
    sparse = job.density < 1
    cells = job.rows * job.features * job.density  # stored cells
    per_cell = 8.0 if sparse else 4.0
    raw = per_cell * cells + (4.0 * job.rows if sparse else 0.0)
    fold_copies = (per_cell + copy_bytes) * fit_rows(job) * job.features * job.density
    bin_bytes = 4 if sparse else 1 if job.max_bins <= 256 else 2
    classes = gradient_dims(job)
    per_fit = 0.0
    trees = 0.0
    if job.library in GBDT:
        per_fit = bin_bytes * cells + job.rows * classes * (8 + 4) + 2 ** min(effective_depth(job), 12) * job.features * job.max_bins * 16
    elif job.library is TabularLibrary.SKLEARN_RF:
        # bootstrap sample indices + per-tree node arrays (~ 2 nodes per leaf sample at full depth, 64 B per node)
        per_fit = 8.0 * job.rows
        leaves = min(2 ** effective_depth(job), job.rows)
        trees = job.trees * 2 * leaves * 64.0
    else:
        per_fit = 8.0 * job.rows * classes + 8.0 * job.features * classes * 20  # lbfgs history
    base = 0.3 * GIB  # Python + library
    return MemoryBreakdown(
        weights=trees,
        gradients=0.0,
        optimizer=0.0,
        activations=raw + parallel_fits * (fold_copies + per_fit),
        overhead=base,
        phase="fit",
    )


def gpu_memory_bytes(job: TabularJob, catalog: Catalog, *, workers: int = 1) -> MemoryBreakdown:
    """GPU memory of one GBDT fit on a device (the training rows of one fold, split over ``workers`` GPUs; folds run
    one after another).

    XGBoost (``device="cuda"``, ``hist``; XGBoost docs "GPU Support: Memory usage": the data set is kept in a
    compressed, quantised ELLPACK matrix, plus working memory per row and histograms per node):

    * the ELLPACK matrix: rows × features symbols of ⌈log2 max_bins⌉ bits — XGBoost ≥ 3.0 stores a dense matrix's
      feature-local bin index with no null symbol (src/data/ellpack_page.cu ``CalcNumSymbols``: "No missing,
      hence no null value"; ``CompressedBufferWriter`` packs each symbol into that many bits);
    * per row: the gradient pair (two floats) and the prediction cache (a float) per target, the label (a float)
      and the row partitioner's two uint32 index buffers (src/tree/gpu_hist/row_partitioner.cu: ``ridx_`` and
      ``ridx_tmp_``, each ``n_samples`` long);
    * histograms: 16 bytes per bin (a pair of int64 fixed-point sums, ``GradientPairInt64``) for every bin of every
      feature, kept for the nodes of the last two levels (the parents are kept to subtract siblings).

    LightGBM's CUDA trainer, the same terms with its own types: uint8 bins for max_bin ≤ 256, else uint16 (LightGBM
    docs, Parameters ``max_bin``: "LightGBM will use uint8_t for feature value if max_bin=255"), float gradient and
    hessian and a double score per row and class, int32 data indices, and double (grad, hess) histograms for up to
    ``num_leaves`` leaves.  CatBoost's GPU trainer is counted like LightGBM's (byte-wide bins up to 256 borders —
    its GPU default is 128 — and histograms for the 2^depth leaves of a symmetric tree): an assumption, not read
    from its source.
    The CUDA context comes on top (assumptions.yaml ``cuda_context_gib``).  Sparse input (``density`` < 1): XGBoost's
    ELLPACK then holds ``row_stride`` symbols a row (the longest row's stored values; the mean is taken), each a
    global bin id or a null symbol (src/data/ellpack_page.cu); LightGBM, a bin and a row index per stored value.
    """
    rows = math.ceil(fit_rows(job) / workers)
    targets = gradient_dims(job)
    bins_total = job.features * job.max_bins
    if job.library is TabularLibrary.XGBOOST:
        if job.density < 1:  # ELLPACK of sparse data: row_stride symbols a row, each a global bin id or the null
            stride = math.ceil(job.features * job.density)  # the mean row length: rows are assumed alike
            bits = max(1, math.ceil(math.log2(job.features * job.max_bins + 1)))
            matrix = rows * stride * bits / 8
        else:
            bits = max(1, math.ceil(math.log2(job.max_bins)))
            matrix = rows * job.features * bits / 8
        per_row = rows * (8 * targets + 4 * targets + 4 + 2 * 4)
        nodes = 2 * 2 ** min(effective_depth(job), 16)  # the last level and its parents
        histograms = nodes * bins_total * 16 * targets
    else:  # stored values only for sparse input: a bin and a 4-byte row index each (an assumption)
        matrix = rows * job.features * ((1 if job.max_bins <= 256 else 2) if job.density >= 1 else 5 * job.density)
        per_row = rows * (8 * targets + 8 * targets + 4)
        leaves = job.num_leaves or 2 ** effective_depth(job)
        histograms = leaves * bins_total * 16 * targets
    context = catalog.assumption("cuda_context_gib") * GIB
    return MemoryBreakdown(weights=0.0, gradients=per_row, optimizer=0.0, activations=matrix + histograms,
                           overhead=context, phase="fit", context=context)  # fmt: skip


def _rate(catalog: Catalog, library: TabularLibrary, device: str) -> TabularRate:
    try:
        return catalog.tabular_rates[(library.value, device)]
    except KeyError:
        raise CatalogError(f"no {device} rate for {library.value} in tabular_rates.csv") from None


def _cpu_rate(job: TabularJob, catalog: Catalog, *, calibrated: bool, notes: list[str]) -> TabularRate:
    """The CPU rate for the job's library release (:func:`release_rate`); a calibration was measured with the
    installed release, so it is applied as measured."""
    rate = _rate(catalog, job.library, "cpu")
    if job.library_version is None:
        return rate
    if calibrated:
        release_row(job, catalog)  # still refuse a release nothing measured
        notes.append(f"library_version {job.library_version} not applied: the calibrated rate was measured with the "
                     "installed release")  # fmt: skip
        return rate
    rate, note = release_rate(job, rate, catalog)
    notes.append(note)  # type: ignore[arg-type]
    return rate


def release_row(job: TabularJob, catalog: Catalog) -> TabularRelease | None:
    """The tabular_releases.csv row that prices the job's ``library_version`` (None when it names none): the newest
    measured release at or below the named one, the measured code nearest to it (releases do not only get faster:
    LightGBM 3.3.5 measured faster than 4.7.0); a named release older than every measured one is refused — a guess
    would be a silent answer."""
    if job.library_version is None:
        return None
    lib = job.library.value
    measured = sorted((r for (name, _), r in catalog.tabular_releases.items() if name == lib), key=lambda r: r.key)
    if not measured:
        raise CatalogError(f"no release of {lib} is measured (tabular_releases.csv); leave it out to price the "
                           "release the rates were measured with", field="library_version")  # fmt: skip
    below = [r for r in measured if r.key <= release_key(job.library_version)]
    if not below:
        raise CatalogError(f"{lib} {job.library_version} is older than every measured release (measured: "
                           f"{', '.join(r.release for r in measured)}; benchmarks/tabular_versions.py measures another)",
                           field="library_version")  # fmt: skip
    return below[-1]


def release_rate(job: TabularJob, rate: TabularRate, catalog: Catalog) -> tuple[TabularRate, str | None]:
    """``rate`` (a CPU rate, measured with one release of the library) for the release the job names
    (``library_version``), and a note saying which measured release priced it: each cost term scaled by that
    release's measured time per term over the rates' release (:func:`release_row`; benchmarks/tabular_versions.py)."""
    r = release_row(job, catalog)
    if r is None:
        return rate, None

    def scaled(value: float | None, factor: float) -> float | None:
        return None if value is None else value * factor

    priced = replace(
        rate,
        ns_per_cell=rate.ns_per_cell * r.dense_cell_factor,
        ns_per_sparse_cell=scaled(rate.ns_per_sparse_cell, r.sparse_cell_factor),
        ns_per_split_bin=scaled(rate.ns_per_split_bin, r.split_bin_factor),
        ns_per_row_level=scaled(rate.ns_per_row_level, r.row_level_factor),
        prep_ns_per_cell=scaled(rate.prep_ns_per_cell, r.prep_factor),
    )
    exact = r.key == release_key(job.library_version)  # type: ignore[arg-type]
    which = "its" if exact else f"{r.release}'s (the nearest measured release below it)"
    return priced, (f"{job.library.value} {job.library_version} priced by {which} measured time per term over the "
                    f"rates' release: x{r.dense_cell_factor:.2f} dense / x{r.sparse_cell_factor:.2f} sparse histogram "
                    f"cells, x{r.split_bin_factor:.2f} split scans, x{r.row_level_factor:.2f} row passes, "
                    f"x{r.prep_factor:.2f} binning")  # fmt: skip


def histogram_sync(job: TabularJob) -> tuple[float, float]:
    """(bytes, ring volume factor) of the histogram exchange per boosting round when one model trains data parallel.

    XGBoost all-reduces every built node's histograms (factor 2, :func:`histogram_allreduce_bytes`); LightGBM's data
    parallel learner reduce-scatters them instead — each machine gets the summed histograms of its share of the
    features, finds their best split, and only the best splits are gathered (Ke et al. 2017, Sec. 5 and LightGBM docs
    "Features: Optimization in Parallel Learning": "Use Reduce Scatter to merge histograms of different
    (non-overlapping) features for different machines"): factor 1 over the same bytes."""
    factor = 1.0 if job.library is TabularLibrary.LIGHTGBM else 2.0
    return histogram_allreduce_bytes(job), factor


def histogram_allreduce_bytes(job: TabularJob) -> float:
    """Bytes of histograms the workers all-reduce per boosting round when one XGBoost model trains over several
    GPUs: each worker builds its rows' histograms and an all-reduce sums them before each level's split search
    (Mitchell et al. 2018, "XGBoost: Scalable GPU Accelerated Learning", arXiv:1806.11248, Sec. 3: "the gradient
    histograms are summed across devices with NCCL AllReduce"). Per level the built nodes — all of the root's level,
    then half of each level's 2^l (the siblings come by subtraction) — times every bin of every feature, 16 bytes a
    bin (``GradientPairInt64``), per target."""
    depth = effective_depth(job)
    built = sum(max(1, 2 ** level // 2) for level in range(depth))
    targets = gradient_dims(job)
    return built * job.features * job.max_bins * 16.0 * targets


def tabular_reason(job: TabularJob, hw: Hardware) -> Rejection | None:
    """Why a tabular job should not run on ``hw`` (one machine: a CPU instance or one GPU)."""
    if hw.layout.nodes > 1 and (hw.accelerator is not None or job.library not in MULTI_NODE_LIBRARIES):
        return Rejection(RejectKind.WASTE, f"{job.library.value} trains on one machine here (XGBoost and LightGBM train one "
                                           "model over several CPU machines through Dask); several nodes only add "
                                           "start-up and cost")  # fmt: skip
    if hw.accelerator is not None:
        if hw.accelerator.kind == "tpu":
            return Rejection(RejectKind.PLATFORM, "no GBDT library trains on TPUs")
        if hw.layout.gpus_per_node > 1 and job.library not in MULTI_GPU_LIBRARIES:
            return Rejection(RejectKind.WASTE, (
                f"{job.library.value} trains one model per GPU here (XGBoost trains one over several through Dask); "
                f"{hw.layout.gpus_per_node - 1} of {hw.layout.gpus_per_node} GPUs would idle — use a 1-GPU instance"
            ))
        if job.library not in GPU_LIBRARIES:
            return Rejection(RejectKind.PLATFORM, f"{job.library.value} has no GPU implementation; use a CPU instance")
        if hw.accelerator.vendor == "amd" and job.library not in ROCM_LIBRARIES:
            return Rejection(RejectKind.PLATFORM, f"{job.library.value}'s GPU trainer is built for CUDA only; no ROCm "
                                                  "build of it was found for AMD GPUs — use an NVIDIA GPU or a CPU")  # fmt: skip
    return None


def estimate_tabular(job: TabularJob, hw: Hardware, catalog: Catalog, *, ns_per_cell: float | None = None) -> Estimate:
    """Time, memory and cost of ``job`` on ``hw``; ``ns_per_cell`` overrides the rate (a calibration)."""
    reason = tabular_reason(job, hw)
    folds = job.cv_folds
    cores = physical_cores(hw.vcpus_per_node, cloud=hw.cloud)
    calibrated = ns_per_cell is not None
    notes: list[str] = []
    gpus = hw.layout.gpus_per_node if hw.accelerator is not None else 1
    gpu_fixed_s = 0.0
    if hw.accelerator is not None and reason is None:
        if job.library_version is not None:
            release_row(job, catalog)  # a release nothing measured is refused here too
            notes.append(f"library_version {job.library_version} is priced on CPUs only: the GPU rate is of its own "
                         "source's release")  # fmt: skip
        rate = _rate(catalog, job.library, "gpu")
        cells = work_cells(job, rate=rate)  # histogram cells of the stored values: the GPU rate's unit
        ns, scaled = gpu_ns_per_cell(rate, hw.accelerator)
        ns = ns_per_cell if ns_per_cell is not None else ns
        fit_s = cells * ns * 1e-9 / gpus  # several GPUs: each builds the histograms of its share of the rows
        # launches and synchronisations per level / split, whatever the rows (benchmarks/tabular_gpu_fixed.py)
        gpu_fixed_s = (rate.gpu_fixed_us_per_step or 0.0) * 1e-6 * gpu_steps(job)
        fit_s += gpu_fixed_s
        parallel_fits = 1
        strategy = "gpu"
        notes.append(f"{job.library.value} on {hw.accelerator.id}: {scaled} from {rate.source}")
        if gpus > 1:
            from trainplan.estimate.comms import collective_seconds
            from trainplan.estimate.steptime import links_for

            try:
                sync_s = rounds_per_fit(job) * collective_seconds(histogram_allreduce_bytes(job), 2.0, hw.layout,
                                                                  links_for(hw, catalog))  # fmt: skip
            except ValueError:  # the instance row has no GPU-to-GPU bandwidth
                sync_s = 0.0
                reason = Rejection(RejectKind.MISSING_FIGURE, f"{hw.label} has no GPU-to-GPU bandwidth in the catalog "
                                                              "for the histogram all-reduce")  # fmt: skip
            fit_s += sync_s
            strategy = "dask-gpu"
            notes.append(f"one model over {gpus} GPUs with xgboost.dask (one worker per GPU, rows split): "
                         f"{sync_s:.1f} s of histogram all-reduce per fit; per-round Dask overheads not modelled")  # fmt: skip
        train_s = folds * fit_s  # folds run one after another on the GPU(s)
    elif hw.layout.nodes > 1 and reason is None:
        # one model over the machines, data parallel (xgboost.dask / LightGBM Dask, one worker a node): each machine
        # bins and builds the histograms of its share of the rows and scans every split; the histograms are summed
        # over the network each round; folds one after another, each over every machine
        rate = _cpu_rate(job, catalog, calibrated=calibrated, notes=notes)
        nodes = hw.layout.nodes
        cells = work_cells(job, rows=math.ceil(fit_rows(job) / nodes), rate=rate)
        ns = ns_per_cell if ns_per_cell is not None else rate.ns_per_cell
        from trainplan.estimate.comms import collective_seconds
        from trainplan.estimate.hardware import Layout
        from trainplan.estimate.steptime import links_for

        sync_bytes, factor = histogram_sync(job)
        try:
            sync_s = rounds_per_fit(job) * collective_seconds(sync_bytes, factor, Layout(1, nodes), links_for(hw, catalog))
        except ValueError:
            sync_s = 0.0
            reason = Rejection(RejectKind.MISSING_FIGURE, f"{hw.label} has no network bandwidth in the catalog for the "
                                                          "histogram exchange")  # fmt: skip
        overhead_s = thread_overhead_s(job, rate, int(cores))
        fit_s = cells * ns * 1e-9 / amdahl_speedup(cores, rate.serial_fraction) + overhead_s + sync_s
        parallel_fits = 1
        train_s = folds * fit_s
        strategy = "dask-cpu"
        dask_name = "xgboost.dask" if job.library is TabularLibrary.XGBOOST else "LightGBM's Dask estimator"
        notes.append(f"one model over {nodes} machines with {dask_name} (data parallel, one worker a machine): "
                     f"{sync_s:.1f} s of histogram exchange per fit; Dask's per-round overheads not modelled")  # fmt: skip
    else:
        rate = _cpu_rate(job, catalog, calibrated=calibrated, notes=notes)
        cells = work_cells(job, rate=rate)
        ns = ns_per_cell if ns_per_cell is not None else rate.ns_per_cell
        parallel_fits = max(1, min(folds, int(cores)))
        cores_per_fit = max(1, int(cores) // parallel_fits)  # whole threads per fit, as trainplan run splits them
        overhead_s = thread_overhead_s(job, rate, cores_per_fit)
        fit_s = cells * ns * 1e-9 / amdahl_speedup(cores_per_fit, rate.serial_fraction) + overhead_s
        train_s = math.ceil(folds / parallel_fits) * fit_s
        strategy = "cpu"
        if parallel_fits > 1:
            notes.append(f"{parallel_fits} folds in parallel, {cores_per_fit:.0f} cores each")
    nodes = hw.layout.nodes if strategy == "dask-cpu" else 1
    share = job if nodes == 1 else job.model_copy(update={"rows": math.ceil(job.rows / nodes)})  # a machine's rows
    host = host_memory_bytes(share, parallel_fits, copy_bytes=library_copy_bytes(job, catalog))
    ram = hw.ram_gib_per_node
    usable = ram * GIB * catalog.assumption("host_ram_usable_fraction")
    mem, capacity = host, ram
    if hw.accelerator is not None and job.library in GPU_LIBRARIES:
        # a GPU option is judged by the GPU's memory, like any other job; the host keeps the caller's array
        mem, capacity = gpu_memory_bytes(job, catalog, workers=gpus), hw.accelerator.memory_gib
        notes.append(f"host RAM {host.peak / GIB:.1f} GiB of {ram:.0f} GiB (the data and the library's copies)")
        if reason is None and mem.peak > capacity * GIB:
            reason = Rejection(
                RejectKind.DEVICE_MEMORY,
                f"needs {mem.peak / GIB:.1f} GiB GPU memory > {capacity:.0f} GiB on {hw.accelerator.id} (quantised "
                f"matrix {mem.activations / GIB:.1f} GiB with histograms, per-row state {mem.gradients / GIB:.1f} GiB); "
                f"XGBoost's external memory (ExtMemQuantileDMatrix) pages the matrix from host RAM instead",
                needed=mem.peak, available=capacity * GIB, unit="bytes",
            )  # fmt: skip
    if reason is None and host.peak > usable:
        reason = Rejection(RejectKind.HOST_MEMORY, f"needs {host.peak / GIB:.1f} GiB RAM > {usable / GIB:.1f} GiB usable of {ram:.0f} GiB on {hw.label}",
                           needed=host.peak, available=usable, unit="bytes")
    breakdown = {"fit_s": fit_s, "folds": float(folds), "parallel_fits": float(parallel_fits)}
    if hw.accelerator is not None and strategy in ("gpu", "dask-gpu") and gpu_fixed_s:
        breakdown["gpu_fixed_s"] = gpu_fixed_s
    if hw.accelerator is None and rate.has_terms and reason is None:
        # where a fit's time goes: each term's share of the compute (the histogram exchange apart)
        share_rows = math.ceil(fit_rows(job) / hw.layout.nodes) if strategy == "dask-cpu" else None
        terms = work_terms(job, rate, rows=share_rows)
        compute_s = fit_s - (sync_s if strategy == "dask-cpu" else 0.0) - overhead_s
        total = sum(terms.values())
        breakdown.update({f"{k}_s": compute_s * v / total for k, v in terms.items()})
        if overhead_s:
            breakdown["thread_sync_s"] = overhead_s
        if strategy == "dask-cpu":
            breakdown["histogram_exchange_s"] = sync_s
    timing = job_timing(hw, train_s=train_s)
    samples = fit_rows(job) * folds  # training rows fitted, all folds
    return Estimate(
        kind="tabular",
        strategy=strategy,
        hardware=hw,
        rejection=reason,
        memory=mem,
        capacity_gib=capacity,
        step_time_s=fit_s / rounds_per_fit(job),
        steps=rounds_per_fit(job) * folds,
        train_s=timing.train_s,
        startup_s=timing.startup_s,
        cost_usd=timing.cost_usd,
        throughput=samples / train_s if train_s > 0 else 0.0,
        throughput_unit="samples_per_s",
        mfu=None,
        time_breakdown=breakdown,
        calibrated=calibrated,
        notes=tuple(notes),
    )
