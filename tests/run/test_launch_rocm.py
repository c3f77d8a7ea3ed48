"""An option on AMD GPUs renders the same launch as NVIDIA's, with one note saying what the nodes need: a ROCm build
of PyTorch (issue 19 item 7).  MI300X has a built-in accelerator row but no priced instance: the test adds one."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch_support import render_to
from trainplan.cli.common import example_path

HEADER = ("cloud,instance,region,vcpus,ram_gib,accelerator,accelerator_count,interconnect,intra_node_bw_gb_s,"
          "network_gbps,price_usd_per_h,spot_price_usd_per_h,cpu_model,source,as_of")  # fmt: skip
NODE = "lab,mi300x-node,lab,96,1850,MI300X,8,infinity-fabric,64,,30,,,test row,2026-12-05"
CLOUD = "cloud,billing_increment_s,billing_minimum_s,startup_s,source,as_of\nlab,1,0,0,test,2026-12-05"


@pytest.fixture
def amd_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "home" / "catalog"
    d.mkdir(parents=True)
    (d / "instances.csv").write_text(f"{HEADER}\n{NODE}\n")
    (d / "clouds.csv").write_text(CLOUD + "\n")
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))


@pytest.mark.usefixtures("amd_catalog")
def test_an_amd_option_says_the_nodes_need_a_rocm_build(tmp_path: Path) -> None:
    job = example_path("llama7b-sft.yaml")
    amd, rendered = render_to(job, "torchrun", tmp_path / "amd", instance="lab:mi300x-node", strategy="fsdp")
    nvidia, plain = render_to(job, "torchrun", tmp_path / "nv", gpu="A100-80GB", gpus=4, strategy="zero2")
    rocm = [n for n in rendered.notes if "ROCm build of PyTorch" in n]
    assert len(rocm) == 1 and "MI300X is an AMD GPU" in rocm[0]
    assert not any("ROCm" in n for n in plain.notes)
    # the same launch otherwise: torchrun over the node's 8 GPUs, NCCL (RCCL on ROCm)
    assert amd.placement.procs_per_node == 8 and "--nproc-per-node=8" in " ".join(rendered.commands[0].argv)


def test_a_tabular_option_on_amd_gpus_names_amds_rocm_build_and_catboost_is_refused(tmp_path: Path) -> None:
    """XGBoost and LightGBM have AMD's ROCm ports (amd_xgboost / amd_lightgbm); the launch says to install them.
    CatBoost's GPU trainer has none: the planner rejects it on an AMD GPU with the reason, NVIDIA GPUs still fit."""
    from trainplan.catalog import get_catalog
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.estimate.tabular import tabular_reason
    from trainplan.spec import parse_job

    job = example_path("xgboost-10m.yaml")
    plan, rendered = render_to(job, "dask", tmp_path / "xgb", instance="runpod:8x_MI300X_SECURE")
    rocm = [n for n in rendered.notes if "AMD GPU" in n]
    assert len(rocm) == 1 and "amd_xgboost" in rocm[0] and "PyTorch" not in rocm[0]
    cat = get_catalog()
    mi300x = hardware_for_gpu(cat.accelerators["MI300X"], cat, gpus=1)
    a100 = hardware_for_gpu(cat.accelerators["A100-80GB"], cat, gpus=1)
    for library, refused in (("catboost", True), ("lightgbm", False), ("xgboost", False)):
        tab = parse_job({"kind": "tabular", "name": "t", "library": library, "rows": 1_000_000, "features": 20})
        why = tabular_reason(tab, mi300x)
        assert (why is not None and "ROCm" in why.text) is refused, library
        assert tabular_reason(tab, a100) is None


def test_the_rocm_note_names_the_framework_the_job_runs() -> None:
    """PyTorch jobs need PyTorch's ROCm build, Keras jobs TensorFlow's (tensorflow-rocm), tabular jobs AMD's port of
    their library; an NVIDIA GPU gets no note."""
    from types import SimpleNamespace

    from trainplan.run.targets import rocm_note

    def note(kind: str, gpu: str = "MI300X", library: str = "xgboost") -> str | None:
        job = SimpleNamespace(kind=SimpleNamespace(value=kind), library=SimpleNamespace(value=library))
        return rocm_note(SimpleNamespace(placement=SimpleNamespace(gpu=gpu), job=job, is_tabular=kind == "tabular"))

    assert "ROCm build of PyTorch" in note("transformer") and "ROCm build of PyTorch" in note("torch")
    assert "tensorflow-rocm" in note("keras") and "PyTorch" not in note("keras")
    assert "amd_lightgbm" in note("tabular", library="lightgbm")
    assert note("transformer", gpu="H100-80GB") is None and note("keras", gpu="A100-80GB") is None
