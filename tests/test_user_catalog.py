"""A user's own catalog (issue 19): rows that add to or override the built-in ones, from --catalog DIR or
$TRAINPLAN_HOME/catalog, validated with one-line errors that name the file, the line and the column."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from trainplan.catalog import DATA_DIR, builtin_catalog, get_catalog
from trainplan.cli.main import main

HEADER = ("cloud,instance,region,vcpus,ram_gib,accelerator,accelerator_count,interconnect,intra_node_bw_gb_s,"
          "network_gbps,price_usd_per_h,spot_price_usd_per_h,cpu_model,source,as_of")  # fmt: skip
NODE = "mycluster,h100-node,lab,192,2048,H100-80GB,8,nvswitch,450,400,16.00,,AMD EPYC 9654,our invoice 2026-11,2026-11-30"
CLOUD = "cloud,billing_increment_s,billing_minimum_s,startup_s,source,as_of\nmycluster,1,0,30,our own cluster,2026-11-30"


def _write(d: Path, **files: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / f"{name}.csv").write_text(text + "\n", encoding="utf-8")
    return d


def _builtin_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(DATA_DIR.glob("*.csv")):
        h.update(p.read_bytes())
    return h.hexdigest()


def _json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_a_users_node_at_their_price_is_planned_and_wins_where_it_should(tmp_path: Path, capsys) -> None:
    d = _write(tmp_path / "cat", instances=f"{HEADER}\n{NODE}", clouds=CLOUD)
    out = _json(capsys, "--catalog", str(d), "plan", "--json")
    best = out["options"][0]
    # 8 x H100 at 16 $/h: the work of p5.48xlarge (55.04 $/h) for under a third of the price
    assert (best["cloud"], best["instance"]) == ("mycluster", "h100-node")
    p5 = next(o for o in out["options"] if o["instance"] == "p5.48xlarge" and o["strategy"] == best["strategy"])
    assert best["cost_usd"] < p5["cost_usd"] / 3
    listed = _json(capsys, "--catalog", str(d), "catalog", "instances", "--json")["instances"]
    row = next(i for i in listed if i["name"] == "h100-node")
    assert row["origin"] == str(d.resolve() / "instances.csv") and row["price_usd_per_h"] == 16.0
    assert all(i["origin"] == "built-in" for i in listed if i["name"] != "h100-node")
    # only this invocation saw it; the built-in catalog is untouched
    assert "h100-node" not in {i.name for i in get_catalog().instances}


def test_a_negotiated_price_overrides_the_built_in_row(tmp_path: Path, capsys, monkeypatch) -> None:
    lines = (DATA_DIR / "instances.csv").read_text().splitlines()
    p5 = next(line for line in lines if line.startswith("aws,p5.48xlarge,"))
    cells = p5.split(",")
    cells[10] = "24.00"  # price_usd_per_h
    home = tmp_path / "home"
    # the built-in header with the row copied from the built-in file (its optional scale_up_gpus column included)
    _write(home / "catalog", instances=f"{lines[0]}\n{','.join(cells)}")
    monkeypatch.setenv("TRAINPLAN_HOME", str(home))  # $TRAINPLAN_HOME/catalog is read without --catalog
    cat = get_catalog()
    row = next(i for i in cat.instances if i.name == "p5.48xlarge")
    assert row.price_usd_per_h == 24.0 and cat.origin("instance", "aws:p5.48xlarge").endswith("instances.csv")
    assert len(cat.instances) == len(builtin_catalog().instances)  # replaced, not added
    assert next(i for i in builtin_catalog().instances if i.name == "p5.48xlarge").price_usd_per_h == 55.04


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"instances": HEADER.replace(",price_usd_per_h", "") + "\n" + NODE}, r"instances.csv:1: price_usd_per_h: column missing"),
        ({"instances": f"{HEADER}\n{NODE.replace('16.00', '-3')}", "clouds": CLOUD}, r"instances.csv:2: price_usd_per_h: must be a finite number >= 0, got '-3'"),
        ({"instances": f"{HEADER}\n{NODE.replace('H100-80GB', 'H100-94GB')}", "clouds": CLOUD}, r"instances.csv:2: accelerator: unknown accelerator 'H100-94GB'"),
        ({"instances": f"{HEADER}\n{NODE}"}, r"instances.csv:2: cloud: 'mycluster' has no billing terms; add a row for it to .*clouds.csv"),
        # SkyPilot's own vms.csv format is not this format: it names the file and the first missing column
        ({"instances": "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region\np5.48xlarge,H100,8,192,2048,98.32,us-east-1"},
         r"instances.csv:1: cloud: column missing from header"),
        ({"vms": "x"}, r"vms.csv: not a catalog file"),
        # a GPU's SM count (what tabular GPU rates scale by) is a whole number
        ({"accelerators": "accelerator,vendor,kind,memory_gib,peak_bf16_tflops,peak_fp16_tflops,peak_fp32_tflops,"
                          "peak_tf32_tflops,mem_bandwidth_gb_s,sm_count,source,as_of\n"
                          "MYGPU,nvidia,gpu,48,180,180,90,90,960,141.5,our datasheet,2026-12-07"},
         r"accelerators.csv:2: sm_count: must be a whole number >= 1, got '141.5'"),
        # a name that would reach a label, a SkyPilot task or a shell: refused, never quoted around
        ({"instances": f"{HEADER}\n{NODE.replace('h100-node', '$(reboot)')}", "clouds": CLOUD},
         r"instances.csv:2: instance: '\$\(reboot\)' is not a name"),
        ({"instances": f'{HEADER}\n{NODE.replace("h100-node", chr(34) + "a b" + chr(34))}', "clouds": CLOUD},
         r"instances.csv:2: instance: 'a b' is not a name"),
    ],
)
def test_bad_rows_are_one_line_naming_file_line_and_column(tmp_path: Path, capsys, files: dict, expected: str) -> None:
    before = _builtin_digest()
    d = _write(tmp_path / "cat", **files)
    assert main(["--catalog", str(d), "plan"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert pytest.importorskip("re").search(expected, err), err
    assert _builtin_digest() == before


def test_a_missing_catalog_directory_and_unknown_clouds_are_clear(tmp_path: Path, capsys) -> None:
    assert main(["--catalog", str(tmp_path / "nope"), "plan"]) == 2
    assert "catalog directory" in capsys.readouterr().err
    job = tmp_path / "job.yaml"
    reference = (DATA_DIR.parent.parent / "examples" / "llama7b-sft.yaml").read_text()
    job.write_text(reference.replace("constraints:\n", "constraints:\n  clouds: [lamda]\n"))
    assert main(["plan", str(job)]) == 2
    err = capsys.readouterr().err
    assert "constraints.clouds" in err and "'lamda' is not a cloud of the catalog" in err
    # a cloud the user's catalog adds is a cloud the job may name
    d = _write(tmp_path / "cat", instances=f"{HEADER}\n{NODE}", clouds=CLOUD)
    job.write_text(job.read_text().replace("lamda", "mycluster"))
    out = _json(capsys, "--catalog", str(d), "plan", str(job), "--json")
    assert {o["cloud"] for o in out["options"]} == {"mycluster"}
