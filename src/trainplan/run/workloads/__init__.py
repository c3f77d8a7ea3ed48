"""Built-in workloads: what ``trainplan run`` trains when no script is given.

* :mod:`~trainplan.run.workloads.transformer` — a causal LM from the job's architecture;
* :mod:`~trainplan.run.workloads.torchjob` — the user's model factory with synthetic or factory data;
* :mod:`~trainplan.run.workloads.tabular` — XGBoost, LightGBM, scikit-learn with parallel CV.

The neural modules import torch; the tabular one does not.
"""
