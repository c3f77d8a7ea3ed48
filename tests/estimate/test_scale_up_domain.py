"""The scale-up domain (issue 19 item 1, issue 18): GPUs that share NVLink across several nodes — GB200 NVL72 is 18
nodes of 4 GPUs in one 72-GPU NVLink domain — bound tensor and expert parallelism by the domain instead of the node,
and their collectives run over NVLink inside it.  Given by a catalog row's optional ``scale_up_gpus`` column."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trainplan.catalog import builtin_catalog
from trainplan.catalog.loader import apply_overlay
from trainplan.errors import CatalogError, SpecError
from trainplan.estimate.hardware import hardware_for_instance
from trainplan.estimate.parallel import parallel_comm
from trainplan.estimate.steptime import links_for
from trainplan.estimate.transformer import transformer_profile
from trainplan.planner.layouts import expert_degrees, tensor_degrees
from trainplan.spec import parse_job
from trainplan.strategies import Layout

HEADER = ("cloud,instance,region,vcpus,ram_gib,accelerator,accelerator_count,interconnect,intra_node_bw_gb_s,"
          "network_gbps,price_usd_per_h,spot_price_usd_per_h,cpu_model,source,as_of,scale_up_gpus")  # fmt: skip
# a rack node as GB200 NVL72 builds them: 4 GPUs a node, 72 in the NVLink domain (a test row: B200's figures)
RACK = "lab,rack-node,lab,144,960,B200,4,nvswitch,900,1600,40,,,test row,2026-12-05,72"
ALONE = "lab,plain-node,lab,144,960,B200,4,nvswitch,900,1600,40,,,test row,2026-12-05,"
CLOUD = "cloud,billing_increment_s,billing_minimum_s,startup_s,source,as_of\nlab,1,0,0,test,2026-12-05"


def _catalog(tmp_path: Path, *rows: str):
    d = tmp_path / "cat"
    d.mkdir()
    (d / "instances.csv").write_text("\n".join((HEADER, *rows)) + "\n")
    (d / "clouds.csv").write_text(CLOUD + "\n")
    return apply_overlay(builtin_catalog(), d)


def test_the_domain_bounds_tensor_and_expert_parallel_and_keeps_their_traffic_on_nvlink(tmp_path: Path) -> None:
    cat = _catalog(tmp_path, RACK, ALONE)
    rack = next(i for i in cat.instances if i.name == "rack-node")
    plain = next(i for i in cat.instances if i.name == "plain-node")
    assert rack.scale_up_gpus == 72 and plain.scale_up_gpus is None
    job = parse_job({"kind": "transformer", "model": "llama-3-70b", "seq_len": 4096, "micro_batch": 1,
                     "global_batch": 64, "precision": "bf16", "steps": 1, "activation_checkpointing": "selective"})  # fmt: skip
    split = transformer_profile(job, cat).split
    in_rack, alone = hardware_for_instance(rack, cat, nodes=4), hardware_for_instance(plain, cat, nodes=4)
    assert (in_rack.layout.domain, alone.layout.domain) == (72, 4)
    # tensor parallel 8 over two 4-GPU nodes: possible inside the NVL72 domain, not across separate nodes
    assert 8 in tensor_degrees(split, in_rack.layout.domain) and 8 not in tensor_degrees(split, alone.layout.domain)
    tp8 = Layout(4, 4, tp=8, sequence_parallel=True, scale_up=72)
    links = links_for(in_rack, cat)
    over_nvlink = parallel_comm(split, tp8, links).tensor
    over_network = parallel_comm(split, replace(tp8, scale_up=0), links).tensor
    # in the rack, tp 8 over two nodes costs what it costs inside one 8-GPU NVLink node; across plain nodes the ring
    # also crosses the network (each GPU's quarter of 1.6 Tb/s against 900 GB/s NVLink)
    assert over_nvlink == pytest.approx(parallel_comm(split, Layout(8, 2, tp=8, sequence_parallel=True), links).tensor)
    assert 0 < over_nvlink < over_network / 3
    # expert parallel: as wide as the domain allows (a 64-expert MoE: 64 inside NVL72, 4 inside a 4-GPU node)
    moe = parse_job({"kind": "transformer", "model": "qwen3-30b-a3b", "seq_len": 4096, "micro_batch": 1, "precision": "bf16",
                     "steps": 1})  # fmt: skip
    moe_split = transformer_profile(moe, cat).split
    assert max(expert_degrees(moe_split, 72)) > max(expert_degrees(moe_split, 4)) == 4


@pytest.mark.parametrize("value", ["6", "2", "4.5", "-8"])
def test_a_domain_that_does_not_hold_whole_nodes_is_one_line(tmp_path: Path, value: str) -> None:
    with pytest.raises(CatalogError) as err:
        _catalog(tmp_path, RACK.rsplit(",", 1)[0] + f",{value}")
    assert "scale_up_gpus" in str(err.value) and "instances.csv" in str(err.value)


def test_a_layout_checks_its_domain() -> None:
    with pytest.raises(SpecError) as err:
        Layout(4, 2, scale_up=6)
    assert err.value.field == "scale_up_gpus"
    assert Layout(8, 2).domain == 8 and Layout(4, 18, scale_up=72).domain == 72
