"""The `trainplan` command: JSON and table output, and one clear `error:` line (exit 2) for every bad input.

Most cases run in-process through ``trainplan.cli.main.main(argv)``; a few run the real entry points
(``python -m trainplan.cli.main`` and the ``trainplan`` console script) in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainplan import get_catalog
from trainplan.cli.main import main

FIXTURES = Path(__file__).parent / "fixtures" / "jobs"
REF = FIXTURES / "llama7b-sft.yaml"
XGB = FIXTURES / "xgboost-10m.yaml"

MEMORY_KEYS = {"peak_gib", "weights_gib", "gradients_gib", "optimizer_gib", "activations_gib", "overhead_gib", "host_gib"}
OPTION_KEYS = {"fits", "strategy", "accelerator", "count", "nodes", "memory", "step_time_s", "train_s", "mfu",
               "hours", "cost_usd", "instance", "cloud"}  # fmt: skip


@pytest.fixture(autouse=True)
def _no_calibrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans must not depend on measured runs recorded on the machine the tests run on."""
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str | Path):
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert err == ""
    return json.loads(out)


def assert_one_error_line(code: int, out: str, err: str, *needles: str) -> str:
    assert "Traceback" not in err and "Traceback" not in out
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: "), line
    for needle in needles:
        assert needle in line, (needle, line)
    assert out == ""
    return line


def _variant(tmp_path: Path, source: Path, old: str, new: str, name: str = "job.yaml") -> Path:
    text = source.read_text(encoding="utf-8")
    assert old in text, old
    p = tmp_path / name
    p.write_text(text.replace(old, new), encoding="utf-8")
    return p


def _subprocess_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TRAINPLAN_HOME": str(tmp_path / "home"), "COLUMNS": "160"}


def _console_script() -> str:
    script = Path(sys.executable).with_name("trainplan")
    if not script.exists():
        pytest.skip("the trainplan console script is not installed next to this interpreter")
    return str(script)


# ----------------------------------------------------------------------------- bad job files

# (where the bad text goes, what replaces what, what the one error line must contain)
BAD_JOBS = {
    "malformed-yaml": (REF, "model: llama-7b", "model: [llama-7b", ("malformed YAML", "line 5, column 5")),
    "missing-field": (REF, "seq_len: 512\n", "", ("seq_len: is required",)),
    "unknown-field": (REF, "micro_batch: 4", "micro_bach: 4", ("micro_bach:", "did you mean 'micro_batch'")),
    "unknown-preset": (REF, "model: llama-7b", "model: llama-7", ("model:", "'llama-7'", "llama-7b")),
    "micro-batch-0": (REF, "micro_batch: 4", "micro_batch: 0", ("micro_batch: must be > 0, got 0",)),
    "seq-len-negative": (REF, "seq_len: 512", "seq_len: -1", ("seq_len: must be > 0, got -1",)),
    "rows-0": (XGB, "rows: 10000000", "rows: 0", ("rows: must be > 0, got 0",)),
    "global-batch": (REF, "global_batch: 128", "global_batch: 130", ("global_batch (130)", "micro_batch (4)")),
    "deadline": (REF, "  max_gpus: 64", "  max_gpus: 64\n  deadline_hours: 0.001",
                 ("constraints.deadline_hours:", "deadline_hours=0.001")),
    "cloud-ibm": (REF, "  clouds: [aws, gcp, azure, local]", "  clouds: [ibm]", ("constraints.clouds", "'ibm'")),
    "budget-negative": (REF, "  max_gpus: 64", "  max_gpus: 64\n  budget_usd: -5",
                        ("constraints.budget_usd: must be > 0",)),
    "budget-too-small": (REF, "  max_gpus: 64", "  max_gpus: 64\n  budget_usd: 0.01",
                         ("constraints.budget_usd:", "the cheapest costs")),
    "nested-unknown": (REF, "  max_gpus: 64", "  max_gpus: 64\n  deadline_hour: 5",
                       ("constraints.deadline_hour:", "did you mean 'deadline_hours'")),
    "kind-typo": (REF, "kind: transformer", "kind: transfomer", ("kind:", "did you mean 'transformer'")),
}  # fmt: skip


PLAN_ONLY = ("deadline", "budget-too-small")  # constraints are applied when planning, not to one estimate


@pytest.mark.parametrize(
    ("case", "command"),
    [(c, cmd) for c in sorted(BAD_JOBS) for cmd in ("plan", "estimate") if cmd == "plan" or c not in PLAN_ONLY],
)
def test_bad_job_file_is_one_error_line(tmp_path: Path, capsys, case: str, command: str) -> None:
    source, old, new, needles = BAD_JOBS[case]
    p = _variant(tmp_path, source, old, new)
    extra = ["--cpus", "16"] if source == XGB else ["--gpu", "A100-80GB", "--gpus", "4"]
    args = ["plan", p, "--json"] if command == "plan" else ["estimate", p, *extra, "--json"]
    assert_one_error_line(*run(capsys, *args), *needles)


def test_missing_job_file(tmp_path: Path, capsys) -> None:
    assert_one_error_line(*run(capsys, "plan", tmp_path / "nope.yaml"), "job file not found", "nope.yaml")


def test_job_file_is_a_directory(tmp_path: Path, capsys) -> None:
    assert_one_error_line(*run(capsys, "plan", tmp_path), "is a directory")


@pytest.mark.parametrize("text", ["", "- a\n- b\n"])
def test_job_file_not_a_mapping(tmp_path: Path, capsys, text: str) -> None:
    p = tmp_path / "job.yaml"
    p.write_text(text, encoding="utf-8")
    assert_one_error_line(*run(capsys, "plan", p), "must be a mapping")


def test_non_utf8_job_file_is_one_error_line(tmp_path: Path, capsys) -> None:
    p = tmp_path / "latin1.yaml"
    p.write_bytes(REF.read_bytes().replace(b"name: llama7b-sft", b"name: caf\xe9"))
    assert_one_error_line(*run(capsys, "plan", p), str(p), "UTF-8")


# ----------------------------------------------------------------------------- bad hardware options of `estimate`


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--gpu", "B400"], ("--gpu:", "unknown accelerator 'B400'", "B200")),
        (["--gpu", "GB300"], ("--gpu:", "no instance in the catalog carries GB300", "your own catalog")),
        (["--gpu", "A100"], ("--gpu:", "ambiguous", "A100-40GB", "A100-80GB")),
        ([], ("give exactly one of --gpu NAME, --instance NAME, --cpus N",)),
        (["--gpu", "H100-80GB", "--cpus", "4"], ("give exactly one of",)),
        (["--gpu", "H100-80GB", "--instance", "p5.48xlarge"], ("give exactly one of",)),
        (["--gpu", "H100-80GB", "--gpus", "0"], ("--gpus: must be >= 1, got 0",)),
        (["--gpu", "H100-80GB", "--nodes", "0"], ("--nodes: must be >= 1, got 0",)),
        (["--cpus", "0"], ("--cpus: must be >= 1, got 0",)),
        (["--instance", "p9.big"], ("--instance:", "unknown instance 'p9.big'")),
        (["--gpu", "H100-80GB", "--strategy", "zero9"], ("--strategy:", "'zero9'", "zero2")),
    ],
)
def test_bad_estimate_hardware_is_one_error_line(capsys, args: list[str], needles: tuple[str, ...]) -> None:
    assert_one_error_line(*run(capsys, "estimate", REF, *args, "--json"), *needles)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["plan", "--objective", "speed"], "--objective"),
        (["estimate", "--gpu", "H100-80GB", "--gpus", "abc"], "--gpus"),
        (["plan", "--top", "0"], "--top"),
        (["catalog", "gpus"], "gpus"),
        (["plann"], "plann"),
        (["plan", "--jsn"], "--jsn"),
    ],
)
def test_usage_errors_are_one_error_line(capsys, args: list[str], needle: str) -> None:
    assert_one_error_line(*run(capsys, *args), needle)


def test_usage_error_through_the_module_entry_point(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "trainplan.cli.main", "plan", "--objective", "speed"],
                          capture_output=True, text=True, env=_subprocess_env(tmp_path), timeout=60)  # fmt: skip
    assert_one_error_line(proc.returncode, proc.stdout, proc.stderr, "--objective")


def test_no_arguments_prints_help_without_a_traceback(capsys) -> None:
    code, out, err = run(capsys)
    assert "Traceback" not in err
    assert code in (0, 2)
    assert "Usage" in out + err


# ----------------------------------------------------------------------------- real entry points (subprocess)


def test_module_entry_point_malformed_yaml(tmp_path: Path) -> None:
    p = _variant(tmp_path, REF, "model: llama-7b", "model: [llama-7b")
    proc = subprocess.run([sys.executable, "-m", "trainplan.cli.main", "plan", str(p)], capture_output=True,
                          text=True, env=_subprocess_env(tmp_path), timeout=60)  # fmt: skip
    assert_one_error_line(proc.returncode, proc.stdout, proc.stderr, "malformed YAML", "line 5, column 5")


def test_console_script_ambiguous_gpu(tmp_path: Path) -> None:
    proc = subprocess.run([_console_script(), "estimate", "--gpu", "A100"], capture_output=True, text=True,
                          env=_subprocess_env(tmp_path), timeout=60)  # fmt: skip
    assert_one_error_line(proc.returncode, proc.stdout, proc.stderr, "A100-40GB", "A100-80GB")


def test_console_script_plans_the_builtin_reference_job(tmp_path: Path) -> None:
    proc = subprocess.run([_console_script(), "plan", "--json"], capture_output=True, text=True,
                          env=_subprocess_env(tmp_path), timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["job"] == "llama7b-sft" and out["options"]


# ----------------------------------------------------------------------------- plan


def _check_option_shape(o: dict) -> None:
    assert OPTION_KEYS <= set(o), OPTION_KEYS - set(o)
    assert MEMORY_KEYS <= set(o["memory"]), MEMORY_KEYS - set(o["memory"])
    m = o["memory"]
    parts = sum(m[k] for k in MEMORY_KEYS - {"peak_gib", "host_gib"})
    assert m["peak_gib"] == pytest.approx(parts)


def test_plan_json_shape(capsys) -> None:
    out = run_json(capsys, "plan", REF, "--json")
    assert out["job"] == "llama7b-sft" and out["objective"] == "cost"
    assert isinstance(out["options"], list) and isinstance(out["rejected"], list)
    assert out["options"] and out["rejected"]
    for o in out["options"]:
        _check_option_shape(o)
        assert o["fits"] is True and o["reason"] is None
        assert o["tokens_per_s"] > 0 and 0 < o["mfu"] < 1
        assert o["memory"]["peak_gib"] <= o["memory"]["capacity_gib"]
        assert o["hours"] == pytest.approx((o["train_s"] + o["startup_s"]) / 3600)
        if o["accelerator"] is None:  # a CPU machine (estimate/cpu.py): one process on every core
            assert o["count"] == 0 and o["nodes"] == 1 and o["strategy"] == "single" and o["vcpus"] >= 1
        else:
            assert o["count"] >= 1 and o["nodes"] >= 1 and o["accelerator"] in get_catalog().accelerators
    for r in out["rejected"]:
        _check_option_shape(r)
        assert r["fits"] is False and r["reason"]
    costs = [round(o["cost_usd"], 4) for o in out["options"]]  # costs within $0.0001 tie (planner.core.rank_key)
    assert costs == sorted(costs)
    assert [o["rank"] for o in out["options"]] == list(range(1, len(costs) + 1))
    assert out["options"][0]["pareto"] is True  # the cheapest is always on the front
    # workstations the job does not list in constraints.owned: listed apart, fitting, unranked
    assert out["unowned"] and all(u["fits"] and "rank" not in u for u in out["unowned"])
    assert all(o["cloud"] != "local" for o in out["options"]) and all(u["cloud"] == "local" for u in out["unowned"])


def test_plan_json_rejects_ddp_on_80gb_gpus_with_an_explanation(capsys) -> None:
    out = run_json(capsys, "plan", REF, "--json")
    on_80 = {"A100-80GB", "H100-80GB"}
    assert not [o for o in out["options"] if o["strategy"] == "ddp" and o["accelerator"] in on_80]
    ddp = [r for r in out["rejected"] if r["strategy"] == "ddp" and r["accelerator"] in on_80 and r["reason"].startswith("needs")]
    assert ddp
    for r in ddp:
        assert "model states 100." in r["reason"]
    assert out["rejected"][0]["hint"]  # the top rejections say what would make them fit


def test_plan_without_argument_plans_the_reference_job(capsys) -> None:
    from trainplan.cli.common import REFERENCE_JOB, example_path

    bare = run_json(capsys, "plan", "--json")
    assert bare == run_json(capsys, "plan", str(example_path(REFERENCE_JOB)), "--json")
    assert bare["job"] == "llama7b-sft"


def test_plan_objective_time_puts_the_fastest_first(capsys) -> None:
    out = run_json(capsys, "plan", REF, "--json", "--objective", "time")
    assert out["objective"] == "time"
    hours = [o["hours"] for o in out["options"]]
    assert hours[0] == min(hours)
    assert hours == sorted(hours)
    by_cost = run_json(capsys, "plan", REF, "--json")
    assert len(by_cost["options"]) == len(out["options"])
    assert by_cost["options"][0]["cost_usd"] <= out["options"][0]["cost_usd"]


def test_plan_tables(capsys) -> None:
    code, out, err = run(capsys, "plan", REF, "--top", "3")
    assert code == 0, err
    assert "llama7b-sft" in out and "options fit" in out and "ranked by cost" in out


def test_plan_reads_in_80_columns(capsys) -> None:
    """Without --wide the table fits 80 columns with every option name and cost whole, and an option that only
    repeats a better row's hardware, time and cost under another strategy is folded into it."""
    code, out, err = run(capsys, "plan", REF, "--top", "10")
    assert code == 0, err
    table = out.split("Time/cost front")[0]
    assert max(map(len, table.splitlines())) <= 80
    full = run_json(capsys, "plan", REF, "--json")["options"]
    shown = [line.split() for line in table.splitlines()[2:] if line.strip()[:1].isdigit()]
    assert len(shown) == 10
    seen = []
    for cells in shown:
        option = full[int(cells[0]) - 1]
        cost = next(c for c in cells if c.startswith("$"))
        assert cells[1].endswith(f"{option['cloud']}:{option['instance']}")  # whole, not "gcp…"
        assert cost == f"${option['cost_usd']:,.2f}"  # not "$6.…"
        seen.append((cells[1], " ".join(cells[4 : cells.index(cost)]), cost))  # option, time, cost
    assert len(seen) == len(set(seen))
    code, wide, _ = run(capsys, "plan", REF, "--top", "10", "--wide", "--all-strategies")
    assert "w/g/o/a/ovh GiB" in wide and "kg CO2e" in wide


def test_plan_marks_stay_whole_in_80_columns(capsys) -> None:
    """In 80 columns with long option names the marks go on their own lines under the option, word for word; an
    option on AMD GPUs is marked ROCm (trainplan renders the run, a ROCm build of PyTorch must run it)."""
    code, out, err = run(capsys, "plan", REF, "--top", "15")
    assert code == 0, err
    table = out.split("Time/cost front")[0]
    assert max(map(len, table.splitlines())) <= 80
    full = run_json(capsys, "plan", REF, "--json")["options"]
    lines = table.splitlines()[2:]
    for k, line in enumerate(lines):
        if not line.strip()[:1].isdigit():
            continue
        option = full[int(line.split()[0]) - 1]
        below = ""  # the marks' lines under the option (wrapped to the option name's width)
        for nxt in lines[k + 1:]:
            if nxt.strip()[:1].isdigit():
                break
            below += " " + nxt
        marks = (line.split(f"${option['cost_usd']:,.2f}")[-1] + " " + below).split()
        amd = get_catalog().accelerators[option["accelerator"]].vendor == "amd"
        assert ("ROCm" in marks) == amd, line
        assert all(m in {"cheapest", "fastest", "pareto", "measured", "borderline", "ROCm", "strategy", "strategies"}
                   or m.startswith("+") for m in marks), (line, below)  # every word whole, none cut


def test_plan_xgboost_json(capsys) -> None:
    out = run_json(capsys, "plan", XGB, "--json")
    assert out["options"]
    for o in out["options"]:
        assert (o["nodes"] == 1 or o["strategy"] == "dask-cpu") and (o["count"] <= 1 or o["strategy"] == "dask-gpu")
        assert o["samples_per_s"] > 0 and "tokens_per_s" not in o
    multi = [r for r in out["rejected"] if r["count"] > 1]
    assert multi and all(r["reason"] for r in multi)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.yaml") if p.name != "torch-mlp.yaml"))
def test_every_fixture_job_plans(capsys, name: str) -> None:
    out = run_json(capsys, "plan", FIXTURES / name, "--json")
    assert out["options"]


def test_plan_fp16_job(tmp_path: Path, capsys) -> None:
    """V100/T4 rejections say "use precision: fp16"; doing so must plan (TPUs have no fp16: rejected)."""
    p = _variant(tmp_path, FIXTURES / "gpt2-pretrain.yaml", "precision: bf16", "precision: fp16")
    out = run_json(capsys, "plan", p, "--json")
    assert any(o["accelerator"] in ("V100-16GB", "V100-32GB", "T4") for o in out["options"])
    tpu = [r for r in out["rejected"] if r["accelerator"] in ("TPUv4", "TPUv5e")]
    assert tpu and all("fp16" in r["reason"] for r in tpu)
    assert not [o for o in out["options"] if o["accelerator"] in ("TPUv4", "TPUv5e")]


# ----------------------------------------------------------------------------- estimate


def _estimate(capsys, *args: str | Path) -> dict:
    return run_json(capsys, "estimate", *args, "--json")


def test_estimate_json_zero2_on_4x_a100_80gb_fits(capsys) -> None:
    e = _estimate(capsys, REF, "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2")
    _check_option_shape(e)
    assert e["fits"] is True and e["reason"] is None
    assert (e["accelerator"], e["count"], e["nodes"], e["strategy"]) == ("A100-80GB", 4, 1, "zero2")
    assert e["memory"]["peak_gib"] < 80
    assert e["tokens_per_s"] > 0 and e["train_s"] > 0 and e["cost_usd"] > 0
    assert e["instance"] is None and e["cloud"] in ("aws", "gcp", "azure")


def test_estimate_json_zero2_on_4x_a100_40gb_does_not_fit_but_offload_does(capsys) -> None:
    e = _estimate(capsys, REF, "--gpu", "a100-40gb", "--gpus", "4", "--strategy", "zero2")
    _check_option_shape(e)
    assert e["fits"] is False
    assert e["reason"].startswith("needs") and "A100-40GB" in e["reason"]
    assert e["memory"]["peak_gib"] > 40
    assert "zero2-offload" in e["hint"]
    off = _estimate(capsys, REF, "--gpu", "A100-40GB", "--gpus", "4", "--strategy", "zero2-offload")
    assert off["fits"] is True and off["memory"]["peak_gib"] < 40 and off["memory"]["host_gib"] > 0


def test_estimate_json_ddp_on_80gb_explains_model_states(capsys) -> None:
    e = _estimate(capsys, REF, "--gpu", "H100-80GB", "--gpus", "8", "--strategy", "ddp")
    assert e["fits"] is False and "model states 100." in e["reason"]


def test_estimate_global_batch_not_divisible_by_data_parallel(capsys) -> None:
    """128 is not a multiple of micro_batch 4 × 3 GPUs: the estimate is returned, not fitting, with the reason."""
    e = _estimate(capsys, REF, "--gpu", "A100-80GB", "--gpus", "3", "--strategy", "zero2")
    assert e["fits"] is False
    assert "global_batch 128" in e["reason"] and "4×3" in e["reason"]
    auto = _estimate(capsys, REF, "--gpu", "A100-80GB", "--gpus", "3")  # no strategy given: none fits either
    assert auto["fits"] is False and "global_batch" in auto["reason"]


def test_estimate_without_strategy_picks_the_fastest_that_fits(capsys) -> None:
    auto = _estimate(capsys, REF, "--gpu", "A100-80GB", "--gpus", "8")
    assert auto["fits"] is True
    for s in ("zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "zero2-offload"):
        other = _estimate(capsys, REF, "--gpu", "A100-80GB", "--gpus", "8", "--strategy", s)
        if other["fits"]:
            assert auto["hours"] <= other["hours"] + 1e-9, s


def test_estimate_instance(capsys) -> None:
    e = _estimate(capsys, REF, "--instance", "p4de.24xlarge", "--strategy", "zero2")
    assert (e["instance"], e["cloud"], e["count"], e["accelerator"]) == ("p4de.24xlarge", "aws", 8, "A100-80GB")
    assert e["fits"] is True


@pytest.mark.parametrize("hardware", [["--cpus", "16"], ["--instance", "c5.9xlarge"], ["--gpu", "T4"]])
def test_estimate_tabular_json(capsys, hardware: list[str]) -> None:
    e = _estimate(capsys, XGB, *hardware)
    _check_option_shape(e)
    assert e["fits"] is True
    assert e["samples_per_s"] > 0 and e["train_s"] > 0
    assert e["samples_per_s"] == pytest.approx(10_000_000 / e["train_s"])
    assert e["strategy"] == ("gpu" if "--gpu" in hardware else "cpu")


def test_estimate_tabular_more_cpus_is_faster(capsys) -> None:
    small = _estimate(capsys, XGB, "--cpus", "8")
    big = _estimate(capsys, XGB, "--cpus", "64")
    assert big["train_s"] < small["train_s"]


def test_estimate_tabular_on_several_gpus(capsys, tmp_path) -> None:
    """XGBoost trains one model over the 4 GPUs (xgboost.dask); LightGBM would leave 3 of them idle."""
    e = _estimate(capsys, XGB, "--gpu", "A100-80GB", "--gpus", "4")
    assert e["fits"] is True and e["strategy"] == "dask-gpu"
    lgb = tmp_path / "lgb.yaml"
    lgb.write_text(XGB.read_text().replace("library: xgboost", "library: lightgbm"))
    e = _estimate(capsys, lgb, "--gpu", "A100-80GB", "--gpus", "4")
    assert e["fits"] is False and "idle" in e["reason"]


def test_estimate_transformer_on_cpus_is_rejected(capsys) -> None:
    e = _estimate(capsys, REF, "--cpus", "64")
    assert e["fits"] is False and "host RAM" in e["reason"] and e["rejection"]["kind"] == "host-memory"


def test_estimate_panel(capsys) -> None:
    code, out, err = run(capsys, "estimate", REF, "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2")
    assert code == 0, err
    assert "A100-80GB" in out and "zero2" in out


# ----------------------------------------------------------------------------- catalog


def test_catalog_json(capsys) -> None:
    out = run_json(capsys, "catalog", "--json")
    assert out["issues"] == []
    ids = {a["accelerator"] if "accelerator" in a else a["id"] for a in out["accelerators"]}
    assert ids == set(get_catalog().accelerators)
    assert len(out["instances"]) == len(get_catalog().instances)
    for row in out["accelerators"] + out["instances"]:
        assert row["source"] and row["as_of"]


def test_catalog_json_one_table(capsys) -> None:
    out = run_json(capsys, "catalog", "accelerators", "--json")
    assert set(out) == {"accelerators", "issues"}
    out = run_json(capsys, "catalog", "instances", "--json")
    assert set(out) == {"instances", "issues"}


def test_catalog_tables(capsys) -> None:
    code, out, err = run(capsys, "catalog")
    assert code == 0, err
    assert "Accelerators" in out and "Instances" in out and "catalog row left out" not in out


def test_catalog_tables_keep_full_names_when_piped(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, err = run(capsys, "catalog")
    assert code == 0, err
    for name in ("A100-80GB", "H100-80GB", "p4de.24xlarge", "Standard_ND96amsr_A100_v4"):
        assert name in out, name


def test_os_errors_are_one_line_with_the_path(capsys, monkeypatch) -> None:
    """A path that cannot be written (here: under /proc; a full disk or a permission likewise) is one line naming
    it, exit 74 (EX_IOERR), no traceback."""
    monkeypatch.delenv("TRAINPLAN_DEBUG", raising=False)
    code, out, err = run(capsys, "report", REF, "-o", "/proc/self/no/such/dir/plan.html")
    assert code == 74 and err.startswith("error: /proc/self/no") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_launch_overwrite_never_deletes_a_runs_results(tmp_path, capsys) -> None:
    out = tmp_path / "ds"
    code, _, err = run(capsys, "launch", REF, "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2",
                       "--to", "deepspeed", "--out", out)  # fmt: skip
    assert code == 0, err
    code, _, err = run(capsys, "launch", REF, "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2",
                       "--to", "deepspeed", "--out", out, "--overwrite")  # fmt: skip
    assert code == 0, err  # a rendered folder is replaced
    (out / "checkpoints").mkdir()  # the run has trained there
    code, _, err = run(capsys, "launch", REF, "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2",
                       "--to", "deepspeed", "--out", out, "--overwrite")  # fmt: skip
    assert code == 2 and "holds a run's results (checkpoints)" in err and (out / "checkpoints").is_dir()


def test_energy_on_a_cloud_without_data_centre_figures_says_why_not_zero_watts(capsys, monkeypatch) -> None:
    """RunPod publishes no PUE or host figures: the energy line is '? kWh' with that reason, not the '0 W per device …
    PUE 1' placeholders the unknown estimate carries; a cloud with figures still shows them."""
    monkeypatch.setenv("COLUMNS", "250")
    code, out, _ = run(capsys, "estimate", REF, "--instance", "runpod:8x_H100-SXM_SECURE", "--strategy", "zero3")
    assert code == 0
    energy = next(line for line in out.splitlines() if line.strip().startswith("energy"))
    assert "? kWh (no data-centre figures for cloud runpod)" in energy and "0 W" not in energy
    code, out, _ = run(capsys, "estimate", REF, "--instance", "p4d.24xlarge", "--strategy", "zero3")
    energy = next(line for line in out.splitlines() if line.strip().startswith("energy"))
    assert code == 0 and "W per device at" in energy and "PUE" in energy
