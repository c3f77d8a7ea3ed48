"""Built-in workload for ``kind: tabular``: XGBoost, LightGBM, CatBoost, scikit-learn.

Data (``data:``) is a CSV or Parquet file with a ``target`` column, an SVMlight / LIBSVM file (``.svm``,
``.libsvm``, ``.svmlight``: sparse, the label first on each line — the format XGBoost's and LightGBM's own
benchmarks use), ``synthetic`` (``rows`` × ``features``, scikit-learn's ``make_classification`` /
``make_regression``; a CSR matrix when ``density`` < 1), or a scikit-learn bundled set (``sklearn:iris``).

With ``cv_folds: k`` (k ≥ 2) the k fits of a (stratified) k-fold
cross-validation run in parallel threads with joblib; every fit gets
``cores // parallel fits`` library threads so the machine is used but not
oversubscribed.  The libraries release the GIL while they fit.  With
``cv_folds: 1`` one fit trains on every row and the reported loss is the
training loss.  Loss is log-loss (classification) or mean squared error.

A *step* is one round of one fit — a tree, or one solver iteration for
``sklearn-linear`` (:func:`trainplan.estimate.tabular.rounds_per_fit`, the
definition the estimate uses too):
progress counts rounds over all fits, ``step_time_s`` is the mean wall time of
a round inside a fit, ``rows_per_s`` counts training rows over all fits per
second of wall time.

Each finished fold is checkpointed (its loss, time and model file); a resumed
run trains only the folds that are missing.  SIGTERM stops the boosting
libraries after their current round and skips folds not yet started.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trainplan.errors import SpecError
from trainplan.estimate.tabular import rounds_per_fit
from trainplan.files import write_json_atomic
from trainplan.run.results import FitResult, Measured, RunStatus, WorkerResult, WorkloadFacts
from trainplan.spec import TabularJob, TabularLibrary

SKLEARN_SETS = ("breast_cancer", "iris", "wine", "digits", "diabetes")
_SKLEARN_REGRESSION = ("diabetes",)
TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
SPARSE_SUFFIXES = (".svm", ".libsvm", ".svmlight")


@dataclass(frozen=True)
class DataShape:
    """Rows, feature columns and target classes of a job's data (classes None for regression)."""

    rows: int
    features: int
    classes: int | None
    density: float = 1.0  # stored cells / (rows × features): below 1 for a sparse (SVMlight) file


# --------------------------------------------------------------------------- data


def _sklearn_name(data: str) -> str:
    name = data.split(":", 1)[1]
    if name not in SKLEARN_SETS:
        raise SpecError(f"unknown scikit-learn set {name!r}; allowed: {', '.join(SKLEARN_SETS)}", field="data")
    return name


def _table_path(job: TabularJob) -> Path:
    path = Path(str(job.data)).expanduser()
    if path.suffix.lower() not in TABLE_SUFFIXES + SPARSE_SUFFIXES:
        raise SpecError(f"{path} is not a table: use a .csv, .parquet or SVMlight (.svm, .libsvm) file, 'synthetic' "
                        "or 'sklearn:<set>'", field="data")  # fmt: skip
    if not path.is_file():
        raise SpecError(f"data file not found: {path}", field="data")
    return path


def is_sparse_file(job: TabularJob) -> bool:
    return job.data not in (None, "synthetic") and Path(str(job.data)).suffix.lower() in SPARSE_SUFFIXES


def _load_svmlight(job: TabularJob, path: Path) -> tuple[Any, np.ndarray]:
    """A CSR matrix (float32, the absent entries not stored) and the labels of an SVMlight / LIBSVM file."""
    if job.target:
        raise SpecError(f"{path.name} is SVMlight: the label is the first value of each line, there is no target column "
                        "to name (remove target)", field="target")  # fmt: skip
    from sklearn.datasets import load_svmlight_file

    try:
        X, y = load_svmlight_file(str(path), dtype=np.float32)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read {path} as SVMlight: {' '.join(str(exc).split())}", field="data") from None
    return X, y


def _columns(path: Path) -> list[str]:
    if path.suffix.lower() == ".csv":
        import pandas as pd

        try:
            return list(pd.read_csv(path, nrows=0).columns)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SpecError(f"cannot read {path} as CSV: {exc}", field="data") from None
    import pyarrow.parquet as pq

    try:
        return list(pq.read_schema(path).names)
    except Exception as exc:  # pyarrow raises ArrowInvalid and OSError subclasses
        raise SpecError(f"cannot read {path} as Parquet: {exc}", field="data") from None


def _read_column(path: Path, column: str) -> Any:
    import pandas as pd

    if path.suffix.lower() == ".csv":
        return pd.read_csv(path, usecols=[column])[column]
    return pd.read_parquet(path, columns=[column])[column]


def _check_target(job: TabularJob, y: Any, source: str) -> int | None:
    """Number of classes the target has (None for regression); checks it against ``objective``."""
    import pandas as pd

    y = pd.Series(y)
    if y.isna().any():
        raise SpecError(f"target column {job.target or 'target'!r} in {source} has missing values", field="target")
    if job.objective == "regression":
        if not pd.api.types.is_numeric_dtype(y):
            raise SpecError(f"objective regression needs a numeric target; {source}'s is {y.dtype}", field="objective")
        return None
    classes = int(y.nunique())
    if classes < 2:
        raise SpecError(f"target in {source} has one class; classification needs at least 2", field="target")
    if job.objective == "binary" and classes != 2:
        raise SpecError(
            f"objective is binary but the target in {source} has {classes} classes; set objective: multiclass",
            field="objective",
        )
    return classes


def inspect_data(job: TabularJob) -> DataShape:
    """Check a job's data before launching (file, target column, objective) and return its shape.

    Cheap: a CSV is read for its header and target column only, a Parquet
    file for its schema and target column.  Raises :class:`SpecError` naming
    ``data``, ``target`` or ``objective``.
    """
    data = job.data
    if data in (None, "synthetic"):
        return DataShape(job.rows, job.features, None if job.objective == "regression" else job.classes, job.density)
    if is_sparse_file(job):
        path = _table_path(job)
        X, y = _load_svmlight(job, path)
        rows, features = X.shape
        if job.library not in (TabularLibrary.XGBOOST, TabularLibrary.LIGHTGBM):
            raise SpecError(f"{path.name} is a sparse (SVMlight) file: xgboost and lightgbm train it; "
                            f"{job.library.value} is run on dense tables", field="library")  # fmt: skip
        return DataShape(rows, features, _check_target(job, y, path.name), density=X.nnz / max(1, rows * features))
    if job.density < 1:
        raise SpecError(f"{job.density:g} describes a sparse matrix; trainplan run reads {data} as a dense table "
                        "(missing cells as NaN): use density: 1 here, an SVMlight file, or --script",
                        field="density")  # fmt: skip
    if data.startswith("sklearn:"):
        X, y = _load_sklearn(_sklearn_name(data))
        _check_categorical(job, [np.asarray(X)[:, c] for c in range(min(job.categorical_features, X.shape[1]))], X.shape[1], data)
        return DataShape(X.shape[0], X.shape[1], _check_target(job, y, data))
    path = _table_path(job)
    columns = _columns(path)
    if not job.target:
        raise SpecError(f"is required when data is a file; columns of {path.name}: {', '.join(columns)}", field="target")
    if job.target not in columns:
        raise SpecError(f"column {job.target!r} is not in {path.name}; columns: {', '.join(columns)}", field="target")
    if len(columns) < 2:
        raise SpecError(f"{path.name} has no feature columns besides {job.target!r}", field="data")
    y = _read_column(path, job.target)
    features = [c for c in columns if c != job.target]
    _check_categorical(job, [_read_column(path, c) for c in features[: job.categorical_features]], len(features), path.name)
    return DataShape(len(y), len(columns) - 1, _check_target(job, y, path.name))


def _check_categorical(job: TabularJob, first_columns: list[Any], features: int, source: str) -> None:
    """The first ``categorical_features`` columns become CatBoost category codes (text is coded, numbers are taken
    as codes): refuse what would be truncated instead — fewer columns than that, or a column of non-integer numbers."""
    k = job.categorical_features
    if not k:
        return
    if k > features:
        raise SpecError(f"{k} categorical columns, but {source} has {features} feature columns", field="categorical_features")
    import pandas as pd

    for i, col in enumerate(first_columns):
        values = pd.Series(col)
        if not pd.api.types.is_numeric_dtype(values):
            continue  # text labels: coded as categories
        numbers = values.dropna().to_numpy(dtype=np.float64)
        if not np.all(numbers == np.floor(numbers)):
            raise SpecError(f"feature column {i + 1} of {source} holds non-integer numbers; the first {k} feature "
                            "columns are taken as categories (text or integer codes): put the categorical columns first",
                            field="categorical_features")  # fmt: skip


def _sparse_table(job: TabularJob) -> tuple[Any, np.ndarray]:
    """Synthetic sparse data (``density`` < 1): a SciPy CSR matrix with ``density`` of its cells stored, uniform
    values at uniformly random positions, and a target from a random linear score of them (the classes split it
    at its quantiles).  XGBoost reads an absent entry as missing and LightGBM as zero; both skip it."""
    import scipy.sparse

    rng = np.random.default_rng(job.seed)
    X = scipy.sparse.random(job.rows, job.features, density=job.density, format="csr", dtype=np.float32, rng=rng)
    score = np.asarray(X @ rng.standard_normal(job.features)).ravel() + 0.1 * rng.standard_normal(job.rows)
    if job.objective == "regression":
        return X, score
    edges = np.quantile(score, np.linspace(0, 1, job.classes + 1)[1:-1])
    return X, np.searchsorted(edges, score).astype(np.int64)


def _load_sklearn(name: str) -> tuple[Any, Any]:
    import sklearn.datasets

    return getattr(sklearn.datasets, f"load_{name}")(return_X_y=True)


def load_table(job: TabularJob) -> tuple[np.ndarray, np.ndarray]:
    """Features (float32, NaN for missing) and target (class ids 0..k-1, or floats)."""
    data = job.data
    if data in (None, "synthetic") and job.density < 1:
        return _sparse_table(job)
    if data in (None, "synthetic"):
        from sklearn.datasets import make_classification, make_regression

        if job.objective == "regression":
            X, y = make_regression(n_samples=job.rows, n_features=job.features, noise=0.1, random_state=job.seed)
        else:
            informative = max(2, min(job.features, max(2, job.features // 2)))
            X, y = make_classification(
                n_samples=job.rows,
                n_features=job.features,
                n_informative=informative,
                n_redundant=0,
                n_classes=job.classes,
                n_clusters_per_class=1,
                random_state=job.seed,
            )
        if job.categorical_features:  # the first columns as categories: a quarter-unit bin of each value (~25 levels)
            X[:, : job.categorical_features] = np.floor(X[:, : job.categorical_features] * 4)
        return X.astype(np.float32), y
    if is_sparse_file(job):
        X, y = _load_svmlight(job, _table_path(job))
        if job.objective == "regression":
            return X, np.asarray(y, dtype=np.float64)
        _, codes = np.unique(y, return_inverse=True)
        return X, codes.astype(np.int64)
    if data.startswith("sklearn:"):
        X, y = _load_sklearn(_sklearn_name(data))
    else:
        import pandas as pd

        path = _table_path(job)
        frame = pd.read_csv(path) if path.suffix.lower() == ".csv" else pd.read_parquet(path)
        y = frame.pop(str(job.target))
        for col in frame.columns:  # categorical text → ordinal codes (missing stays missing)
            if not pd.api.types.is_numeric_dtype(frame[col]):
                codes = frame[col].astype("category").cat.codes.astype("float32")
                frame[col] = codes.where(codes >= 0)
        X = frame.to_numpy(dtype=np.float32, na_value=np.nan)
    X = np.asarray(X, dtype=np.float32)
    if job.objective == "regression":
        return X, np.asarray(y, dtype=np.float64)
    _, codes = np.unique(np.asarray(y), return_inverse=True)
    return X, codes.astype(np.int64)


# --------------------------------------------------------------------------- parallelism


def parallelism(folds: int, cores: int, devices: int | None = None) -> tuple[int, int]:
    """``(parallel fits, library threads per fit)`` for ``folds`` fits on ``cores`` cores.

    ``devices`` caps the parallel fits (``--devices`` on a tabular job).
    Threads per fit = cores // parallel fits, at least 1, so fits × threads ≤ cores.
    """
    parallel = max(1, min(folds, cores, devices or folds))
    return parallel, max(1, cores // parallel)


def fold_indices(job: TabularJob, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """``(train, validation)`` row indices per fold; one fold of every row when ``cv_folds`` is 1."""
    n = len(y)
    if job.cv_folds == 1:
        return [(np.arange(n), None)]
    from sklearn.model_selection import KFold, StratifiedKFold

    if job.cv_folds > n:
        raise SpecError(f"cv_folds ({job.cv_folds}) exceeds the {n} rows", field="cv_folds")
    splitter: Any
    if job.objective == "regression":
        splitter = KFold(n_splits=job.cv_folds, shuffle=True, random_state=job.seed)
    else:
        smallest = int(np.bincount(y).min())
        if smallest < job.cv_folds:
            raise SpecError(f"the rarest class has {smallest} rows, fewer than cv_folds ({job.cv_folds})", field="cv_folds")
        splitter = StratifiedKFold(n_splits=job.cv_folds, shuffle=True, random_state=job.seed)
    return [(tr, va) for tr, va in splitter.split(np.zeros(n), y)]


# --------------------------------------------------------------------------- fitting


class Stopped(Exception):
    """A fit was interrupted by SIGTERM."""


def _loss(job: TabularJob, y: np.ndarray, pred: np.ndarray, classes: int | None) -> float:
    from sklearn.metrics import log_loss, mean_squared_error

    if job.objective == "regression":
        return float(mean_squared_error(y, pred))
    assert classes is not None
    proba = pred if pred.ndim == 2 else np.column_stack([1 - pred, pred])
    return float(log_loss(y, proba, labels=list(range(classes))))


def xgboost_params(job: TabularJob, classes: int | None, threads: int) -> dict[str, Any]:
    """``xgboost.train`` parameters of the job (``classes``: the classes in the data; None for regression)."""
    regression = job.objective == "regression"
    params: dict[str, Any] = {
        "tree_method": "hist",
        "max_depth": job.max_depth or 6,
        "eta": job.learning_rate,
        "max_bin": job.max_bins,
        "nthread": threads,
        "seed": job.seed,
        "objective": "reg:squarederror" if regression else ("binary:logistic" if classes == 2 else "multi:softprob"),
    }
    if job.num_leaves:
        params["max_leaves"] = job.num_leaves
    if not regression and classes and classes > 2:
        params["num_class"] = classes
    return params


def lightgbm_params(job: TabularJob, classes: int | None, threads: int) -> dict[str, Any]:
    """``lightgbm.train`` parameters of the job (the Dask estimators take the same keywords)."""
    regression = job.objective == "regression"
    params: dict[str, Any] = {
        "objective": "regression" if regression else ("binary" if classes == 2 else "multiclass"),
        "learning_rate": job.learning_rate,
        "num_leaves": job.num_leaves or 31,
        "max_depth": job.max_depth or -1,
        "max_bin": job.max_bins,
        "num_threads": threads,
        "seed": job.seed,
        "deterministic": True,
        "force_row_wise": True,
        "verbosity": -1,
    }
    if not regression and classes and classes > 2:
        params["num_class"] = classes
    return params


def catboost_params(job: TabularJob, classes: int | None, threads: int) -> dict[str, Any]:
    """``CatBoostClassifier`` / ``CatBoostRegressor`` parameters of the job (symmetric trees, CatBoost's default)."""
    regression = job.objective == "regression"
    return {
        "iterations": job.trees,
        "depth": job.depth,  # the depth the estimate counts (max_depth, else log2 num_leaves, else 6)
        "learning_rate": job.learning_rate,
        "border_count": min(job.max_bins, 65535),
        "thread_count": threads,
        "random_seed": job.seed,
        "loss_function": "RMSE" if regression else ("Logloss" if classes == 2 else "MultiClass"),
        "allow_writing_files": False,  # no catboost_info/ folder in the working directory
        "verbose": False,
    }


def _catboost_frame(X: np.ndarray, categorical: list[int]) -> Any:
    """The table as CatBoost takes categorical columns: the first ``categorical_features`` columns as integer
    category codes (a missing value is its own category, -1), the rest as they are."""
    if not categorical:
        return X
    import pandas as pd

    frame = pd.DataFrame(X)
    for c in categorical:
        frame[c] = np.nan_to_num(X[:, c], nan=-1.0).astype(np.int64)
    return frame


def _fit_one(
    job: TabularJob,
    X_tr: np.ndarray,
    y_tr: np.ndarray,
    classes: int | None,
    threads: int,
    on_round: Callable[[], None],
    stop: threading.Event,
    model_path: Path,
) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    """Fit one model; returns its predict function (probabilities or values) and rounds done."""
    lib = job.library
    regression = job.objective == "regression"
    if lib is TabularLibrary.XGBOOST:
        import xgboost as xgb

        class Progress(xgb.callback.TrainingCallback):
            def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
                on_round()
                return stop.is_set()

        params = xgboost_params(job, classes, threads)
        booster = xgb.train(params, xgb.DMatrix(X_tr, label=y_tr, nthread=threads), job.trees, callbacks=[Progress()])
        if stop.is_set() and booster.num_boosted_rounds() < job.trees:
            raise Stopped
        booster.save_model(str(model_path.with_suffix(".ubj")))
        return (lambda X: booster.predict(xgb.DMatrix(X, nthread=threads))), booster.num_boosted_rounds()
    if lib is TabularLibrary.LIGHTGBM:
        import lightgbm as lgb

        def progress(env: Any) -> None:
            on_round()
            if stop.is_set():
                raise Stopped

        lparams = lightgbm_params(job, classes, threads)
        booster = lgb.train(lparams, lgb.Dataset(X_tr, label=y_tr), num_boost_round=job.trees, callbacks=[progress])
        booster.save_model(str(model_path.with_suffix(".txt")))
        return (lambda X: booster.predict(X, num_threads=threads)), booster.current_iteration()
    if lib is TabularLibrary.CATBOOST:
        import catboost

        class Rounds:
            def after_iteration(self, info: Any) -> bool:  # CatBoost's callback protocol: False stops training
                on_round()
                return not stop.is_set()

        cls = catboost.CatBoostRegressor if regression else catboost.CatBoostClassifier
        model = cls(**catboost_params(job, classes, threads))
        cat = list(range(job.categorical_features))
        model.fit(_catboost_frame(X_tr, cat), y_tr, cat_features=cat or None, callbacks=[Rounds()])
        if stop.is_set() and model.tree_count_ < job.trees:
            raise Stopped
        model.save_model(str(model_path.with_suffix(".cbm")))
        predict = model.predict if regression else model.predict_proba
        return (lambda X: predict(_catboost_frame(X, cat))), int(model.tree_count_)
    from threadpoolctl import threadpool_limits

    model = _sklearn_model(job, classes, threads)
    if stop.is_set():
        raise Stopped
    with threadpool_limits(limits=threads):
        model.fit(X_tr, y_tr)
    rounds = rounds_per_fit(job)
    for _ in range(rounds):
        on_round()
    predict = model.predict if regression else model.predict_proba
    return predict, rounds


def _sklearn_model(job: TabularJob, classes: int | None, threads: int) -> Any:
    regression = job.objective == "regression"
    if job.library is TabularLibrary.SKLEARN_HGB:
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        cls = HistGradientBoostingRegressor if regression else HistGradientBoostingClassifier
        return cls(
            max_iter=job.trees,
            learning_rate=job.learning_rate,
            max_depth=job.max_depth,
            max_leaf_nodes=job.num_leaves or 31,
            max_bins=min(job.max_bins, 255),
            early_stopping=False,
            random_state=job.seed,
        )
    if job.library is TabularLibrary.SKLEARN_RF:
        from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

        rf = RandomForestRegressor if regression else RandomForestClassifier
        return rf(n_estimators=job.trees, max_depth=job.max_depth, n_jobs=threads, random_state=job.seed)
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    head = Ridge() if regression else LogisticRegression(max_iter=job.iterations, C=1.0)
    return make_pipeline(SimpleImputer(), StandardScaler(), head)


class _Progress:
    """Counts rounds over all fits and writes throttled metrics lines (thread-safe)."""

    def __init__(self, write: Callable[[dict[str, Any]], None], total: int, done: int, rows_per_round: float, t0: float, before_s: float) -> None:
        self._write, self.total, self.done = write, total, done
        self._rows_per_round = rows_per_round
        self._t0, self._before = t0, before_s
        self._lock = threading.Lock()
        self._last = 0.0
        self._losses: list[float] = []

    def round(self) -> None:
        with self._lock:
            self.done += 1
            now = time.perf_counter()
            if now - self._last >= 0.5:
                self._last = now
                self._emit(now)

    def fit_done(self, loss: float) -> None:
        with self._lock:
            self._losses.append(loss)
            self._emit(time.perf_counter(), loss=float(np.mean(self._losses)))

    def _emit(self, now: float, **extra: Any) -> None:
        wall = now - self._t0
        record = {"step": self.done, "total_steps": self.total, "elapsed_s": self._before + wall, **extra}
        if wall > 0:
            record["rows_per_s"] = self.done * self._rows_per_round / wall if self.done else 0.0
        self._write(record)


def train_tabular(job: TabularJob, **options: Any) -> dict[str, Any]:
    """:func:`fit_folds` (same keyword arguments), with the result as its JSON object (the form of ``result.json``)."""
    return fit_folds(job, **options).to_dict()


def fit_folds(
    job: TabularJob,
    *,
    out_dir: Path,
    parallel_fits: int,
    threads_per_fit: int,
    write_metrics: Callable[[dict[str, Any]], None],
    stop: threading.Event,
) -> WorkerResult:
    """Train every fold (the missing ones, on resume); returns the run's result.

    The result has no peak memory and the defaults of a one-process CPU run;
    the worker fills in what it measured around the call.
    """
    from joblib import Parallel, delayed

    X, y = load_table(job)
    classes = None if job.objective == "regression" else int(y.max()) + 1
    folds = fold_indices(job, y)
    fold_dir = out_dir / "checkpoints" / "folds"
    models = out_dir / "models"
    fold_dir.mkdir(parents=True, exist_ok=True)
    models.mkdir(parents=True, exist_ok=True)
    state_file = out_dir / "checkpoints" / "tabular_state.json"
    before_s = json.loads(state_file.read_text())["train_s"] if state_file.exists() else 0.0
    finished = {r.fold: r for r in (_read_fold(p) for p in sorted(fold_dir.glob("fold*.json")))}
    todo = [k for k in range(len(folds)) if k not in finished]
    rounds = rounds_per_fit(job)
    avg_rows = float(np.mean([len(tr) for tr, _ in folds]))
    t0 = time.perf_counter()
    progress = _Progress(write_metrics, rounds * len(folds), rounds * len(finished), avg_rows, t0, before_s)
    if finished:
        write_metrics({"event": "resume", "folds_done": sorted(finished)})
    state_lock = threading.Lock()

    def run_fold(k: int) -> FitResult | None:
        if stop.is_set():
            return None
        tr, va = folds[k]
        start = time.perf_counter()
        try:
            predict, done = _fit_one(job, X[tr], y[tr], classes, threads_per_fit, progress.round, stop, models / f"fold{k}")
        except Stopped:
            return None
        fit_s = time.perf_counter() - start
        rows_eval = tr if va is None else va
        loss = _loss(job, y[rows_eval], predict(X[rows_eval]), classes)
        result = FitResult(fold=k, loss=loss, fit_s=fit_s, rows=len(tr), rounds=done)
        with state_lock:  # the fold, then the clock: a resumed run counts this time
            write_json_atomic(fold_dir / f"fold{k}.json", result.to_dict())
            write_json_atomic(state_file, {"train_s": before_s + time.perf_counter() - t0})
        progress.fit_done(loss)
        return result

    ran = Parallel(n_jobs=parallel_fits, prefer="threads")(delayed(run_fold)(k) for k in todo)
    wall = time.perf_counter() - t0
    train_s = before_s + wall
    write_json_atomic(state_file, {"train_s": train_s})
    for r in ran:
        if r is not None:
            finished[r.fold] = r
    done = [finished[k] for k in sorted(finished)]
    complete = len(done) == len(folds)
    measured = Measured(
        train_s=train_s,
        step_time_s=float(np.mean([r.fit_s / max(1, r.rounds) for r in done])) if done else None,
        rows_per_s=sum(r.rows for r in done) / train_s if done and train_s > 0 else None,
        final_loss=float(np.mean([r.loss for r in done])) if complete else None,
    )
    workload = WorkloadFacts(
        rows=int(X.shape[0]),
        features=int(X.shape[1]),
        classes=classes,
        fits=len(folds),
        rows_per_fit=avg_rows,
        rounds_per_fit=rounds,
        depth=job.depth,
        parallel_fits=parallel_fits,
        threads_per_fit=threads_per_fit,
    )
    return WorkerResult(
        status=RunStatus.COMPLETED if complete else RunStatus.PREEMPTED,
        steps=sum(r.rounds for r in done),
        measured=measured,
        workload=workload,
        folds=tuple(done),
    )


def _read_fold(path: Path) -> FitResult:
    return FitResult.from_dict(json.loads(path.read_text(encoding="utf-8")))

