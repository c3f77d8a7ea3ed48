"""`trainplan catalog import-skypilot [DIR]` (issue 19): SkyPilot's vms.csv files into the user's catalog, on fixture
files in SkyPilot's format (tests/fixtures/skypilot/v7: the columns and row shapes of its catalogs/v7 files)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from trainplan.catalog import builtin_catalog, get_catalog
from trainplan.cli.main import main

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "skypilot" / "v7"


def _import(capsys, *argv: str) -> dict:
    assert main(["catalog", "import-skypilot", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_every_row_of_the_fixture_is_imported_or_skipped_with_its_reason(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path))
    out = _import(capsys, str(FIXTURE))
    assert len(out["files"]) == 3 and out["target"] == str(tmp_path / "catalog")
    rows = _rows(tmp_path / "catalog" / "instances.csv")
    added = {(r["cloud"], r["instance"]) for r in rows}
    assert added == {("fluidstack", "cpu_4x_general"), ("fluidstack", "gpu_8x_h100_sxm5"), ("fluidstack", "gpu_1x_a100_sxm4"),
                     ("fluidstack", "gpu_1x_a6000"), ("gcp", "n2-standard-8")}  # fmt: skip
    assert out["skipped"] == {
        "GPU GH200 has no accelerators.csv row": 1,
        "no on-demand price": 1,  # the fixture cloud's B200 row has none
        "no instance type (a GPU priced apart from its machine, GCP)": 2,  # a2-highgpu-1g and the bare A100 row
        "already in the built-in catalog": 2,  # aws p5.48xlarge and g5.xlarge
    }
    h100 = next(r for r in rows if r["instance"] == "gpu_8x_h100_sxm5")
    # one row per instance type, at the cheapest of its regions; SkyPilot's names mapped to trainplan's ids
    assert (h100["price_usd_per_h"], h100["region"], h100["accelerator"], h100["accelerator_count"]) == ("23.92", "us-east-1", "H100-80GB", "8")
    assert "cheapest of 2 region(s)" in h100["source"] and h100["interconnect"] == "nvswitch"
    assert next(r for r in rows if r["instance"] == "gpu_1x_a100_sxm4")["accelerator"] == "A100-40GB"
    assert next(r for r in rows if r["instance"] == "gpu_1x_a6000")["accelerator"] == "RTXA6000"  # SkyPilot's "A6000"
    assert out["clouds_added"] == ["fluidstack"]  # a cloud the built-in catalog lacks
    cat = get_catalog()  # the written files load with every check of a user's catalog
    assert len(cat.instances) == len(builtin_catalog().instances) + 5 == out["instances_in_catalog"]
    assert cat.origin("instance", "fluidstack:gpu_8x_h100_sxm5").endswith("instances.csv")
    # an imported 8xH100 node at $23.92/h is planned beside the built-in ones, ranked by its price
    assert main(["plan", "--json"]) == 0
    options = json.loads(capsys.readouterr().out)["options"]
    mine = next(o for o in options if (o["cloud"], o["instance"]) == ("fluidstack", "gpu_8x_h100_sxm5"))
    same = [o for o in options if o["strategy"] == mine["strategy"] and o["hours"] == mine["hours"]
            and o["instance"] in ("8x_H100-SXM_SECURE", "gpu-h100-sxm_8gpu-128vcpu-1600gb", "p5.48xlarge")]
    # built-in 8xH100 nodes: runpod $21.52/h and nebius $23.60/h cost less, aws p5.48xlarge $55.04/h more
    assert len(same) == 3 and all((o["cost_usd"] < mine["cost_usd"]) == (o["cloud"] in ("runpod", "nebius")) for o in same)


def test_the_users_rows_are_never_replaced(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path))
    mine = tmp_path / "catalog"
    mine.mkdir()
    header = ("cloud,instance,region,vcpus,ram_gib,accelerator,accelerator_count,interconnect,intra_node_bw_gb_s,network_gbps,"
              "price_usd_per_h,spot_price_usd_per_h,cpu_model,source,as_of,my_note")  # fmt: skip
    (mine / "instances.csv").write_text(f"{header}\nfluidstack,gpu_8x_h100_sxm5,us-east-1,208,1800,H100-80GB,8,nvswitch,450,,19.5,,,"
                                        "our reserved price,2026-11-01,keep me\n")  # fmt: skip
    (mine / "clouds.csv").write_text("cloud,billing_increment_s,billing_minimum_s,startup_s,source,as_of\n"
                                     "fluidstack,60,600,120,our contract,2026-11-01\n")  # fmt: skip
    out = _import(capsys, str(FIXTURE))
    assert out["instances_kept"] == 1 and out["clouds_added"] == []
    rows = _rows(mine / "instances.csv")
    own = next(r for r in rows if r["instance"] == "gpu_8x_h100_sxm5")
    assert own["price_usd_per_h"] == "19.5" and own["my_note"] == "keep me"
    assert len(rows) == 5  # the user's row + the four other importable instances
    assert _rows(mine / "clouds.csv")[0]["source"] == "our contract"


def test_another_format_or_no_catalog_is_one_clear_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))
    wrong = tmp_path / "v7" / "aws"
    wrong.mkdir(parents=True)
    # trainplan's own instances.csv columns are not SkyPilot's
    (wrong / "vms.csv").write_text("cloud,instance,region,price_usd_per_h\naws,p5.48xlarge,us-east-1,55.04\n")
    assert main(["catalog", "import-skypilot", str(tmp_path / "v7")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "vms.csv:1: InstanceType: column missing; not a SkyPilot vms.csv" in err
    assert not (tmp_path / "home" / "catalog" / "instances.csv").exists()  # nothing written
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    monkeypatch.delenv("SKYPILOT_CATALOG", raising=False)
    assert main(["catalog", "import-skypilot"]) == 2
    err = capsys.readouterr().err
    assert "no SkyPilot catalog at" in err and str(tmp_path / "nohome" / ".sky" / "catalogs") in err


def test_a_row_trainplan_would_refuse_or_a_damaged_file_writes_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    """The import loads the catalog it would leave before replacing a file: a GPU row without a count, or an instance
    name with a NUL byte (the loader refuses both), is one line, exit 2, and the user's directory stays as it was."""
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))
    src = tmp_path / "v7" / "lambda"
    src.mkdir(parents=True)
    header = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,GpuInfo,SpotPrice\n"
    (src / "vms.csv").write_text(header + "gpu_8x_h100,H100,eight,208.0,1800.0,23.92,us-east-1,,\n")
    assert main(["catalog", "import-skypilot", str(tmp_path / "v7")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing was written" in err and "accelerator_count" in err
    assert not (tmp_path / "home" / "catalog" / "instances.csv").exists()
    (src / "vms.csv").write_bytes(header.encode() + b"gpu\x00_1x,H100,1,1,1,1,us,,\n")
    assert main(["catalog", "import-skypilot", str(tmp_path / "v7")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing was written" in err and "is not a name" in err
    assert not (tmp_path / "home" / "catalog" / "instances.csv").exists()
