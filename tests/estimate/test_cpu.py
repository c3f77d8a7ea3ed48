"""CPUs as a device for neural networks (issue 8, part 5): rules, host-RAM memory, the CPU time model,
CPU options in plans, this machine's measured cores, and cpus.csv validation.

No test depends on timing: measured figures come from hand-made hardware profiles.
"""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from trainplan.catalog import DATA_DIR, get_catalog, load_catalog
from trainplan.cli.main import main
from trainplan.estimate.compose import compose
from trainplan.estimate.cpu import cpu_step_time
from trainplan.estimate.hardware import cpu_rates_from_spec, hardware_for_cpus, hardware_for_instance
from trainplan.estimate.memory import GIB
from trainplan.estimate.result import RejectKind
from trainplan.estimate.steptime import optimizer_bytes_touched
from trainplan.estimate.transformer import transformer_profile
from trainplan.measure.microbench import Measurement
from trainplan.measure.probe import cpu_model_name, usable_cores
from trainplan.measure.profile import HardwareProfile, save_profile, this_host
from trainplan.planner import plan_job
from trainplan.planner.local import measured_cpu_rates, predict_run
from trainplan.spec import Precision, parse_job
from trainplan.strategies import Strategy

MLP = """
from torch import nn

def mlp(width=128, depth=2):
    layers = [nn.Linear(32, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 4))
"""

TINY_LLAMA = {"layers": 2, "hidden": 128, "heads": 4, "ffn_hidden": 344, "vocab": 1024, "max_seq_len": 128}


@pytest.fixture(autouse=True)
def empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No hardware profile and no calibration unless a test writes one: catalog figures only."""
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINPLAN_HOME", str(home))
    return home


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "tp_cpu_models.py").write_text(MLP)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _torch_job(**extra):
    return {"kind": "torch", "model": "tp_cpu_models:mlp", "inputs": [{"shape": [32]}], "micro_batch": 16,
            "steps": 10, "precision": "fp32", **extra}  # fmt: skip


def _write(tmp_path: Path, data: dict, name: str = "job.yaml") -> Path:
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _estimate(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code = main(["estimate", *args, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def _profile(*, fp32_tflops: float = 0.1, bf16_tflops: float | None = 0.001, bw_gb_s: float = 10.0,
             threads: int = 2, overhead_gib: float | None = 0.09) -> HardwareProfile:  # fmt: skip
    """A hardware profile of this host, as `trainplan probe` would save it, with chosen figures."""
    ms = [Measurement("matmul_fp32", fp32_tflops, "TFLOP/s", "cpu", f"torch.matmul 1024x1024 fp32, {threads} threads, best of 9"),
          Measurement("memory_bandwidth", bw_gb_s, "GB/s", "cpu", f"torch copy_ 256 MiB float32, {threads} threads")]  # fmt: skip
    if bf16_tflops is not None:
        ms.append(Measurement("matmul_bf16", bf16_tflops, "TFLOP/s", "cpu", f"torch.matmul 512x512 bf16, {threads} threads"))
    if overhead_gib is not None:
        ms.append(Measurement("cpu_runtime_overhead", overhead_gib, "GiB", "cpu", "fresh interpreter"))
    machine = {"cpu_model": cpu_model_name(), "cpu_cores": usable_cores(), "memory_gib": 64.0, "accelerator": "cpu",
               "gpus": []}  # fmt: skip
    return HardwareProfile(recorded_at="2026-12-03T00:00:00+00:00", host=this_host(),
                           hardware_id=f"cpu:{cpu_model_name()}:{usable_cores()}", machine=machine,
                           measurements=tuple(ms))  # fmt: skip


# ----------------------------------------------------------------------------- memory and capacity


def test_a_small_torch_job_fits_on_two_vcpus_in_host_ram_without_cuda_overhead(models: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("torch")
    cat = get_catalog()
    e = _estimate(capsys, str(_write(tmp_path, _torch_job())), "--cpus", "2")
    hw = hardware_for_cpus(2, cat)
    usable = hw.ram_gib_per_node * cat.assumption("host_ram_usable_fraction")
    assert e["fits"] is True and e["strategy"] == "single" and e["accelerator"] is None
    m = e["memory"]
    assert m["capacity_gib"] == pytest.approx(usable)
    # no CUDA context, no caching-allocator reserve: the context is PyTorch's CPU runtime; beyond the tensors,
    # what glibc's heap keeps (simulated over the traced step repeated, estimate/heap.py)
    assert m["context_gib"] == pytest.approx(cat.assumption("cpu_runtime_overhead_gib"))
    assert m["context_gib"] != pytest.approx(cat.assumption("cuda_context_gib"))
    kept = e["trace"]["heap_retention_gib"]
    assert kept >= 0 and m["reserved_gib"] == pytest.approx(m["allocated_gib"] + kept)
    assert m["reserved_expandable_gib"] == pytest.approx(m["allocated_gib"])
    assert m["peak_gib"] == pytest.approx(m["reserved_gib"] + m["context_gib"])
    # a traced step: its operators' dispatch is a term of its own
    assert e["step_time_s"] > 0 and set(e["time_breakdown_s"]) == {"compute_s", "memory_s", "dispatch_s", "optimizer_s"}
    # the verdict's band is the one measured for CPUs (host RAM against trainplan run's peak RSS), not a GPU band
    assert e["memory_verdict"]["band"] == cat.assumption("memory_error_band_cpu")
    assert e["memory_verdict"]["band"] != cat.assumption("memory_error_band_trace")


def test_a_7b_transformer_is_rejected_on_a_cpu_box_for_host_memory() -> None:
    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": "llama-2-7b", "seq_len": 2048, "micro_batch": 1, "steps": 10})
    hw = hardware_for_instance(next(i for i in cat.instances if i.name == "c6i.8xlarge"), cat)
    e = compose(job, transformer_profile(job, cat), hw, Strategy.SINGLE, cat)
    r = e.rejection
    assert r is not None and r.kind is RejectKind.HOST_MEMORY and r.unit == "bytes"
    assert "host RAM" in r.text and "64 GiB" in r.text
    assert r.available == pytest.approx(64 * cat.assumption("host_ram_usable_fraction") * GIB)
    assert r.needed == pytest.approx(e.memory.peak) and r.needed > r.available
    # model states alone: fp32 weights + grads + AdamW (4 + 4 + 8 bytes per parameter)
    assert e.memory.weights + e.memory.gradients + e.memory.optimizer == pytest.approx(16 * e.params, rel=1e-3)
    # host RAM is a CPU's device memory: the memory verdict is the verdict, not "rejected for another reason"
    assert e.memory_verdict().startswith("does not fit, short by") and "another reason" not in e.memory_verdict()


def test_the_optimizer_step_on_a_cpu_holds_one_parameter_s_temporaries(models: Path) -> None:
    """torch.optim loops over parameters on CPU: AdamW's temporaries are two copies of the largest parameter,
    not the multi-tensor buffer over all of them that the GPU estimate counts."""
    pytest.importorskip("torch")
    from trainplan.estimate.torchjob import trace_torch_job

    cat = get_catalog()
    job = parse_job(_torch_job(model_args={"width": 256, "depth": 4}))
    profile = trace_torch_job(job)
    cpu = compose(job, profile, hardware_for_cpus(4, cat), Strategy.SINGLE, cat)
    assert cpu.memory.phase == "optimizer"
    temporaries = cpu.memory.overhead - cpu.memory.context
    assert temporaries == pytest.approx(2 * 4 * 256 * 256)  # the largest weight, 256 x 256 fp32, twice
    assert temporaries < profile.memory.optimizer_temporaries


# ----------------------------------------------------------------------------- rules


@pytest.mark.parametrize(
    ("strategy", "kind", "words"),
    [
        (Strategy.DDP, RejectKind.LAYOUT, "one process uses every core"),
        (Strategy.ZERO2, RejectKind.LAYOUT, "not planned on CPUs"),
        (Strategy.ZERO2_OFFLOAD, RejectKind.PLATFORM, "already"),
        (Strategy.ZERO3_OFFLOAD, RejectKind.PLATFORM, "already"),
    ],
)
def test_multi_process_and_offload_strategies_are_rejected_on_cpus(strategy: Strategy, kind: RejectKind, words: str) -> None:
    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": TINY_LLAMA, "seq_len": 64, "micro_batch": 2, "steps": 5})
    e = compose(job, transformer_profile(job, cat), hardware_for_cpus(8, cat), strategy, cat)
    assert e.rejection is not None and e.rejection.kind is kind and words in e.reason


@pytest.mark.parametrize(("extra", "words"), [({"method": "qlora"}, "QLoRA"), ({"optimizer": "adam8bit"}, "adam8bit")])
def test_bitsandbytes_is_rejected_on_cpus(extra: dict, words: str) -> None:
    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": TINY_LLAMA, "seq_len": 64, "micro_batch": 2, "steps": 5, **extra})
    e = compose(job, transformer_profile(job, cat), hardware_for_cpus(8, cat), Strategy.SINGLE, cat)
    assert e.rejection.kind is RejectKind.PLATFORM and "bitsandbytes" in e.reason and words in e.reason


def _on(name: str, precision: str):
    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": TINY_LLAMA, "seq_len": 64, "micro_batch": 2, "steps": 5,
                     "precision": precision})  # fmt: skip
    hw = hardware_for_instance(next(i for i in cat.instances if i.name == name), cat)
    return compose(job, transformer_profile(job, cat), hw, Strategy.SINGLE, cat), hw


def test_fp16_needs_fp16_units_and_bf16_says_how_it_is_computed() -> None:
    ice_fp16, _ = _on("c6i.8xlarge", "fp16")  # Ice Lake: no AVX512-FP16
    assert ice_fp16.rejection.kind is RejectKind.PRECISION and "no fp16 units" in ice_fp16.reason
    spr_fp16, _ = _on("m7i.8xlarge", "fp16")  # Sapphire Rapids: AVX512-FP16
    assert spr_fp16.fits
    ice_bf16, ice = _on("c6i.8xlarge", "bf16")
    spr_bf16, spr = _on("m7i.8xlarge", "bf16")
    assert ice_bf16.fits and spr_bf16.fits
    assert any("no bf16 units, computed via fp32" in n for n in ice_bf16.notes)
    assert any("computed on its bf16 units" in n for n in spr_bf16.notes)
    # Ice Lake's bf16 runs at its fp32 rate; Sapphire Rapids' at its AMX rate (1024 vs 64 FLOPs/cycle/core)
    flops = ice_bf16.flops_per_step
    assert ice_bf16.time_breakdown["compute_s"] == pytest.approx(flops / ice.cpu.rate("fp32"))
    assert spr_bf16.time_breakdown["compute_s"] == pytest.approx(flops / spr.cpu.rate("bf16"))
    assert spr.cpu.rate("bf16") / spr.cpu.rate("fp32") == pytest.approx(1024 / 64)


# ----------------------------------------------------------------------------- the time model


def test_cpu_step_time_is_the_hand_computation_from_the_catalog_row() -> None:
    cat = get_catalog()
    inst = next(i for i in cat.instances if i.name == "c6i.8xlarge")
    row = cat.cpus[inst.cpu_model]
    # by hand from the cpus.csv row: 32 vCPUs = 16 cores x 64 FLOPs/cycle x 3.5 GHz x the default efficiency;
    # bandwidth = 204.8 GB/s per 32-core socket x 16/32 x its efficiency; element-wise rate = the measured
    # per-core figure x 16 cores x 3.5 / 3.6 GHz x 64 / 32 FLOPs per cycle (AVX-512 against the AVX2 reference)
    cores = inst.vcpus / row.threads_per_core
    assert (cores, row.fp32_flops_per_cycle_per_core, row.all_core_ghz, row.mem_bw_gb_s_per_socket) == (16, 64, 3.5, 204.8)
    rate = cores * 64 * 3.5e9 * cat.assumption("cpu_matmul_efficiency")
    bw = 204.8e9 * cores / row.cores_per_socket * cat.assumption("cpu_mem_bw_efficiency")
    act = cat.assumption("cpu_activation_gb_s_per_core") * 1e9 * 16 * 3.5 / 3.6 * 64 / 32
    hw = hardware_for_instance(inst, cat)
    assert hw.cpu.rate("fp32") == pytest.approx(rate) and hw.cpu.mem_bw_bytes_s == pytest.approx(bw)
    assert hw.cpu.activation_bytes_s == pytest.approx(act)

    flops, acts, params, micro = 3.0e12, 2.0e9, 5.0e7, 4
    st = cpu_step_time(hw=hw, strategy=Strategy.SINGLE, precision=Precision.FP32, optimizer=parse_job(
        {"kind": "transformer", "model": TINY_LLAMA, "seq_len": 8, "micro_batch": 1, "steps": 1}).optimizer,
        micro_steps=micro, flops_executed=flops, flops_model=flops, activations=acts, trainable_params=params)  # fmt: skip
    opt_bytes = params * (2 * 4 + 4 + 2 * 8)  # AdamW fp32: read+write weights, read grads, read+write 2 states
    assert optimizer_bytes_touched(params, parse_job({"kind": "transformer", "model": TINY_LLAMA, "seq_len": 8,
                                                      "micro_batch": 1, "steps": 1}).optimizer,
                                   Precision.FP32, Strategy.SINGLE) == pytest.approx(opt_bytes)  # fmt: skip
    expected = micro * flops / rate + micro * acts / act + opt_bytes / bw
    assert st.seconds == pytest.approx(expected)
    assert st.breakdown == pytest.approx({"compute_s": micro * flops / rate, "memory_s": micro * acts / act,
                                          "optimizer_s": opt_bytes / bw})  # fmt: skip
    # MFU against the spec peak (without the efficiency)
    assert st.mfu == pytest.approx(micro * flops / (expected * cores * 64 * 3.5e9))


def test_more_cores_are_faster_and_a_cpu_is_slower_than_a_gpu() -> None:
    cat = get_catalog()
    model = {"layers": 4, "hidden": 1024, "heads": 16, "ffn_hidden": 2752, "vocab": 8192, "max_seq_len": 512}
    job = parse_job({"kind": "transformer", "model": model, "seq_len": 512, "micro_batch": 8, "steps": 100,
                     "precision": "fp32"})  # fmt: skip
    prof = transformer_profile(job, cat)
    by = {i.name: compose(job, prof, hardware_for_instance(i, cat), Strategy.SINGLE, cat) for i in cat.instances
          if i.name in ("c6i.8xlarge", "c6i.16xlarge", "g5.xlarge")}  # fmt: skip
    assert by["c6i.16xlarge"].step_time_s < by["c6i.8xlarge"].step_time_s
    assert by["g5.xlarge"].step_time_s < by["c6i.16xlarge"].step_time_s  # one A10G beats 32 Ice Lake cores


# ----------------------------------------------------------------------------- plans


def test_a_plan_for_a_tiny_model_ranks_a_cheaper_cpu_box_first(models: Path) -> None:
    """On Azure the cheapest machine is a 16-vCPU CPU box ($0.677/h against $3.06/h for the V100 one); a tiny MLP
    trains in seconds on it, well inside the deadline, so it ranks first by cost."""
    pytest.importorskip("torch")
    job = parse_job(_torch_job(steps=200, constraints={"clouds": ["azure"], "deadline_hours": 1}))
    plan = plan_job(job)
    cpu = [e for e in plan.options if e.hardware.accelerator is None]
    gpu = [e for e in plan.options if e.hardware.accelerator is not None]
    assert cpu and gpu, "the plan has both kinds of options"
    best = plan.best
    assert best.hardware.accelerator is None and best.strategy == "single"
    assert best.hardware.instance.name == "Standard_F16s_v2"
    assert best.cost_usd < min(e.cost_usd for e in gpu)
    assert best.hours < job.constraints.deadline_hours  # fast enough
    # the brute-force check: the cheapest fitting option of all is the one ranked first
    assert best.cost_usd == min(e.cost_usd for e in plan.options)


def test_a_plan_with_a_probe_here_prices_this_machine_s_cores_as_measured(models: Path, empty_home: Path) -> None:
    pytest.importorskip("torch")
    save_profile(_profile(fp32_tflops=0.1, bw_gb_s=10.0))
    job = parse_job(_torch_job(constraints={"clouds": ["local"]}))
    plan = plan_job(job)
    here = [e for e in (*plan.options, *plan.rejected) if e.hardware.instance and e.hardware.instance.name == "this-machine"]
    assert len(here) == 1 and here[0].fits and here[0].hardware.cpu.measured
    assert here[0].hardware.cpu.rate("fp32") == pytest.approx(0.1e12)
    assert any("measured by trainplan probe" in n for n in here[0].notes)
    # this machine is owned (it was probed) and ranked; the workstations' CPUs fit too, listed apart unless owned
    assert any(e is here[0] for e in plan.options)
    assert any(e.hardware.label.endswith(" CPUs") for e in plan.unowned)


# ----------------------------------------------------------------------------- this machine, measured


def test_measured_rates_scale_with_vcpus_and_say_where_they_come_from() -> None:
    prof = _profile(fp32_tflops=0.12, bf16_tflops=0.0006, bw_gb_s=8.0, threads=2, overhead_gib=0.09)
    two, eight = measured_cpu_rates(prof), measured_cpu_rates(prof, 8)
    assert two.rate("fp32") == pytest.approx(0.12e12) and eight.rate("fp32") == pytest.approx(4 * 0.12e12)
    assert eight.mem_bw_bytes_s == pytest.approx(4 * 8e9)
    assert two.runtime_overhead_bytes == pytest.approx(0.09 * GIB)
    # no element-wise figure in this profile: the catalog's per-core figure x the probe's threads
    assert two.activation_bytes_s == pytest.approx(get_catalog().assumption("cpu_activation_gb_s_per_core") * 1e9 * 2)
    with_act = replace(prof, measurements=prof.measurements + (Measurement("activation_rate", 3.0, "GB/s", "cpu", "x"),))
    assert measured_cpu_rates(with_act, 4).activation_bytes_s == pytest.approx(2 * 3.0e9)
    assert "measured by trainplan probe" in two.source and "scaled to 8 vCPUs" in eight.source
    # an emulated bf16 (slower than fp32) is not a bf16 unit: bf16 jobs are computed via fp32
    from trainplan.estimate.cpu import compute_dtype

    assert compute_dtype(Precision.BF16, two) == "fp32"
    assert compute_dtype(Precision.BF16, replace(two, matmul=(("fp32", 1e11), ("bf16", 4e11)))) == "bf16"


def test_estimate_cpus_uses_this_machine_s_measured_cores(models: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("torch")
    path = str(_write(tmp_path, _torch_job()))
    spec = _estimate(capsys, path, "--cpus", "2")
    save_profile(_profile(fp32_tflops=0.05, bw_gb_s=5.0, overhead_gib=0.2))
    measured = _estimate(capsys, path, "--cpus", "2")
    assert any("measured by trainplan probe" in n for n in measured["notes"])
    assert not any("measured by trainplan probe" in n for n in spec["notes"])
    assert measured["memory"]["context_gib"] == pytest.approx(0.2)
    compute = measured["time_breakdown_s"]["compute_s"]
    assert compute == pytest.approx(measured["flops_per_step"] / 0.05e12)


def test_run_prediction_on_this_cpu_uses_the_probe_and_fp32(models: Path) -> None:
    """`trainplan run` trains CPU jobs in fp32; its prediction is the CPU model over the probe's figures."""
    pytest.importorskip("torch")
    job = parse_job(_torch_job(precision="bf16"))
    kind = f"cpu:{cpu_model_name()}:2"
    before = predict_run(job, "single", 1, kind)
    assert before.get("step_time_s") is None and "trainplan probe" in before["note"]
    save_profile(_profile(fp32_tflops=0.05, bf16_tflops=0.5, bw_gb_s=5.0))
    got = predict_run(job, "single", 1, kind)
    assert got["step_time_s"] > 0 and got["peak_gib"] > 0 and got["samples_per_s"] > 0 and got["note"] is None
    fp32_job = parse_job(_torch_job(precision="fp32"))
    assert predict_run(fp32_job, "single", 1, kind)["step_time_s"] == pytest.approx(got["step_time_s"])
    ddp = predict_run(job, "ddp", 2, kind)
    assert ddp.get("step_time_s") is None and "single" in ddp["note"]


# ----------------------------------------------------------------------------- cpus.csv validation and bad input


def test_cpus_csv_bad_rows_are_listed_and_left_out(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    path = data / "cpus.csv"
    rows = list(csv.DictReader(path.open(newline="", encoding="utf-8")))
    good = dict(rows[0])
    bad = [
        dict(good, cpu_model="Clock in MHz", all_core_ghz="3500"),
        dict(good, cpu_model="Three threads", threads_per_core="3"),
        dict(good, cpu_model="No fp32", fp32_flops_per_cycle_per_core=""),
        dict(good, cpu_model="Per socket", bf16_flops_per_cycle_per_core="49152"),
        dict(good, cpu_model="No source", source=""),
        dict(good),  # a duplicate of the first row
    ]
    with path.open("a", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(good))
        for row in bad:
            writer.writerow(row)
    cat = load_catalog(data)
    issues = [i for i in cat.issues if i.file == "cpus.csv"]
    n = len(rows)
    assert [(i.line, i.key) for i in issues] == [
        (n + 2, "all_core_ghz"), (n + 3, "threads_per_core"), (n + 4, "fp32_flops_per_cycle_per_core"),
        (n + 5, "bf16_flops_per_cycle_per_core"), (n + 6, "source"), (n + 7, "row"),
    ]  # fmt: skip
    assert "MHz" in str(issues[0]) and "duplicate of line 2" in str(issues[-1])
    assert set(cat.cpus) == {r["cpu_model"] for r in rows}  # the good rows, none of the bad
    assert get_catalog().issues == ()  # the shipped file is clean


def test_every_cpu_only_instance_and_workstation_has_a_cpus_row() -> None:
    cat = get_catalog()
    for inst in cat.instances:
        if inst.accelerator is None or inst.cloud == "local":
            assert inst.cpu_model in cat.cpus, inst.name
            assert hardware_for_instance(inst, cat).cpu is not None
    for row in cat.cpus.values():
        assert row.source and row.as_of and row.peak_flops_per_core("fp32")


def test_bad_input_gives_one_clear_line(models: Path, tmp_path: Path, capsys) -> None:
    path = str(_write(tmp_path, _torch_job()))
    assert main(["estimate", path, "--cpus", "2", "--strategy", "zero9"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "--strategy" in lines[0] and "Traceback" not in err
    assert main(["estimate", path, "--cpus", "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["error: --cpus: must be >= 1, got 0"]


def test_an_unknown_cpu_is_a_missing_figure_not_a_crash() -> None:
    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": TINY_LLAMA, "seq_len": 64, "micro_batch": 2, "steps": 5})
    hw = replace(hardware_for_cpus(4, cat), cpu=None, cpu_model="Some Future CPU")
    e = compose(job, transformer_profile(job, cat), hw, Strategy.SINGLE, cat)
    assert e.rejection.kind is RejectKind.MISSING_FIGURE and "Some Future CPU" in e.reason and "cpus.csv" in e.reason
    assert e.step_time_s == float("inf")


def test_spec_rates_follow_the_row(tmp_path: Path) -> None:
    cat = get_catalog()
    row = cat.cpus["Intel Xeon Platinum 8488C (Sapphire Rapids)"]
    rates = cpu_rates_from_spec(row, 32, cat)
    assert rates.cores == 16 and not rates.measured
    assert rates.peak_rate("bf16") == pytest.approx(16 * 1024 * 3.2e9)
    assert rates.rate("fp16") == pytest.approx(16 * 128 * 3.2e9 * cat.assumption("cpu_matmul_efficiency"))


def test_the_runtime_overhead_probe_measures_a_fresh_process() -> None:
    """trainplan.measure.cpu_rate: PyTorch's CPU runtime, measured in a fresh interpreter (Linux only)."""
    pytest.importorskip("torch")
    from trainplan.measure.cpu_rate import NAME, runtime_overhead_gib

    m = runtime_overhead_gib(threads=1)
    assert m.name == NAME and m.unit == "GiB" and m.device == "cpu"
    if not Path("/proc/self/clear_refs").exists():
        assert m.value is None and "clear_refs" in m.note
        return
    assert m.value is not None and 0.01 < m.value < 1.0, m  # tens of MiB of kernel libraries, not GiBs
    assert "fresh interpreter" in m.method and "1 threads" in m.method


def test_measured_rates_use_the_probes_thread_scaling_of_a_training_step() -> None:
    """With the 1-thread GEMM and the reference steps' speedup in the profile, a training step's matmul rate on n
    threads is the 1-thread rate x Amdahl's speedup (parallel fraction from the measured speedup), not the
    t-thread GEMM x n/t; bf16 and the element-wise rate follow the same law; the peak stays the GEMM's."""
    from trainplan.planner.local import amdahl_speedup, parallel_fraction

    prof = _profile(fp32_tflops=0.16, bf16_tflops=0.0008, bw_gb_s=30.0, threads=2, overhead_gib=0.09)
    extra = (Measurement("matmul_fp32_1thread", 0.08, "TFLOP/s", "cpu", "torch.matmul 1024x1024 fp32, 1 threads"),
             Measurement("cpu_step_scaling", 1.5, "x", "cpu", "reference steps at 1 and 2 threads"),
             Measurement("activation_rate", 2.0, "GB/s", "cpu", "x"))  # fmt: skip
    scaled = replace(prof, measurements=prof.measurements + extra)
    p = parallel_fraction(1.5, 2)
    assert p == pytest.approx(2 / 3) and amdahl_speedup(2, p) == pytest.approx(1.5)
    two, eight = measured_cpu_rates(scaled), measured_cpu_rates(scaled, 8)
    assert two.rate("fp32") == pytest.approx(0.08e12 * 1.5)  # not the 2-thread GEMM's 0.16e12
    assert eight.rate("fp32") == pytest.approx(0.08e12 * amdahl_speedup(8, p))  # 2.4x, not 8x
    assert eight.rate("bf16") == pytest.approx(0.0008e12 * 4 * eight.rate("fp32") / (0.16e12 * 4))
    assert two.activation_bytes_s == pytest.approx(2.0e9)
    assert eight.activation_bytes_s == pytest.approx(2.0e9 * amdahl_speedup(8, p) / 1.5)
    assert eight.peak_rate("fp32") == pytest.approx(4 * 0.16e12) and eight.mem_bw_bytes_s == pytest.approx(4 * 30e9)
    assert "Amdahl speedup" in eight.source
    # the step time follows: a compute-bound step on 8 vCPUs is 8 / 2.4 times slower than the GEMM's scaling says
    old = measured_cpu_rates(prof, 8)
    assert old.rate("fp32") / eight.rate("fp32") == pytest.approx(0.16e12 * 4 / (0.08e12 * amdahl_speedup(8, p)))
    # a speedup below 1 (contention) is no parallelism; above linear is all parallel
    assert parallel_fraction(0.8, 2) == 0.0 and parallel_fraction(2.5, 2) == 1.0


def _lstm_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, *, inputs: int, hidden: int) -> None:
    """Write ``module.py`` with ``lstm()``: a 2-layer batch-first nn.LSTM(inputs, hidden), importable from tmp_path."""
    (tmp_path / f"{module}.py").write_text(
        "from torch import nn\n\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"        self.rnn = nn.LSTM({inputs}, {hidden}, num_layers=2, batch_first=True)\n\n"
        "    def forward(self, x):\n"
        "        return self.rnn(x)[0]\n\n"
        "def lstm():\n"
        "    return M()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))


def test_an_lstm_traces_with_the_flops_of_its_cpu_operator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nn.LSTM on CPU is one oneDNN operator per layer (aten.mkldnn_rnn_layer); it used to trace at 0 FLOPs."""
    pytest.importorskip("torch")
    from trainplan.estimate.torchjob import trace_torch_job

    _lstm_factory(tmp_path, monkeypatch, "tp_cpu_lstm", inputs=16, hidden=32)
    job = parse_job({"kind": "torch", "model": "tp_cpu_lstm:lstm", "inputs": [{"shape": [10, 16]}], "micro_batch": 4,
                     "steps": 1, "precision": "fp32"})  # fmt: skip
    p = trace_torch_job(job)
    steps_x_batch, hidden = 10 * 4, 32
    forward = 2 * steps_x_batch * (4 * hidden * 16 + 4 * hidden * hidden) + 2 * steps_x_batch * (4 * hidden * hidden * 2)
    assert p.flops.forward == pytest.approx(forward)
    assert p.flops.backward == pytest.approx(2 * forward)


def test_cpu_options_of_a_torch_job_use_a_trace_for_the_cpu_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan's CPU options take the job traced for the CPU (oneDNN's LSTM workspace), its GPU options the CUDA trace."""
    pytest.importorskip("torch")
    from trainplan.catalog import find_accelerator
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.estimate.trace.workspace import mkldnn_lstm_workspace_bytes
    from trainplan.planner.core import make_estimator

    _lstm_factory(tmp_path, monkeypatch, "tp_cpu_lstm2", inputs=64, hidden=128)
    job = parse_job({"kind": "torch", "model": "tp_cpu_lstm2:lstm", "inputs": [{"shape": [50, 64]}], "micro_batch": 16,
                     "steps": 1, "precision": "fp32"})  # fmt: skip
    cat = get_catalog()
    est = make_estimator(job, cat)
    on_cpu = est(hardware_for_cpus(2, cat), Strategy.SINGLE)
    on_gpu = est(hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=1), Strategy.SINGLE)
    workspaces = mkldnn_lstm_workspace_bytes(50, 16, 64, 128) + mkldnn_lstm_workspace_bytes(50, 16, 128, 128)
    assert on_cpu.memory.activations - on_gpu.memory.activations >= 0.9 * workspaces
    assert est(hardware_for_cpus(4, cat), Strategy.SINGLE).memory.activations == on_cpu.memory.activations


@pytest.mark.parametrize(("inputs", "hidden", "steps", "batch", "layers", "bidirectional"),
                         [(128, 256, 64, 32, 2, False), (50, 100, 10, 3, 1, False), (300, 64, 7, 5, 2, True),
                          (17, 33, 20, 1, 1, False)])  # fmt: skip
def test_onednn_lstm_workspace_formula_equals_the_real_operators(inputs: int, hidden: int, steps: int, batch: int,
                                                                 layers: int, bidirectional: bool) -> None:  # fmt: skip
    """oneDNN's LSTM keeps a workspace for backward (the 4th output of aten.mkldnn_rnn_layer): its size from
    oneDNN's layout equals what the real operator returns, byte for byte, for each layer and direction."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainplan.estimate.trace.workspace import cpu_rnn_saved_workspace

    seen: list[tuple[int, int]] = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            got = cpu_rnn_saved_workspace(func, args, kwargs or {}, out)
            if got is not None:
                seen.append((got[0].untyped_storage().nbytes(), got[1]))
            return out

    lstm = torch.nn.LSTM(inputs, hidden, num_layers=layers, bidirectional=bidirectional)
    with Spy():
        lstm(torch.randn(steps, batch, inputs, requires_grad=True))
    assert len(seen) == layers * (2 if bidirectional else 1)
    for real, modelled in seen:
        assert real > 0 and modelled == real


def test_a_cpu_trace_of_an_lstm_keeps_onednns_workspace_until_backward() -> None:
    """Traced for a CPU job, an LSTM's activations include each layer's oneDNN workspace (the fake kernel returns
    it empty); a GRU (native PyTorch cells, no oneDNN) gets none, and a CUDA-target trace is left as it was."""
    torch = pytest.importorskip("torch")
    from trainplan.estimate.trace import trace_training_step
    from trainplan.estimate.trace.workspace import mkldnn_lstm_workspace_bytes

    def build(cell: str):  # type: ignore[no-untyped-def]
        rnn = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](16, 32, num_layers=2, batch_first=True)

        class M(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.rnn = rnn

            def forward(self, x):  # type: ignore[no-untyped-def]
                return self.rnn(x)[0]

        return M()

    def trace(cell: str, device: str):  # type: ignore[no-untyped-def]
        return trace_training_step(lambda: build(cell), lambda mb: (torch.randn(mb, 10, 16),), micro_batch=4, precision="fp32",
                                   optimizer="adamw", device=device)  # fmt: skip

    workspaces = mkldnn_lstm_workspace_bytes(10, 4, 16, 32) + mkldnn_lstm_workspace_bytes(10, 4, 32, 32)
    lstm_cpu, lstm_cuda = trace("lstm", "cpu"), trace("lstm", "cuda")
    assert lstm_cpu.activation_peak_bytes - lstm_cuda.activation_peak_bytes >= workspaces - 64 * 1024
    gru_cpu, gru_cuda = trace("gru", "cpu"), trace("gru", "cuda")
    assert abs(gru_cpu.activation_peak_bytes - gru_cuda.activation_peak_bytes) < 64 * 1024
