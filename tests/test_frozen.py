"""trainplan.frozen.evolve: the same copy as dataclasses.replace, without re-running a plain dataclass's constructor."""

from __future__ import annotations

import dataclasses

import pytest

from trainplan.catalog import find_instance, get_catalog
from trainplan.estimate.hardware import hardware_for_instance
from trainplan.frozen import evolve
from trainplan.planner.core import estimate_option
from trainplan.spec import parse_job
from trainplan.strategies import Layout, Strategy


def test_evolve_equals_replace_and_leaves_the_original() -> None:
    cat = get_catalog()
    hw = hardware_for_instance(find_instance("aws:p4d.24xlarge", cat), cat, nodes=2)
    layout = hw.layout.split(tp=2, pp=2, sequence_parallel=True)
    assert evolve(hw, layout=layout) == dataclasses.replace(hw, layout=layout)
    assert hw.layout.tp == 1 and evolve(hw, network_gbps=1.0).network_gbps == 1.0
    job = parse_job({"kind": "transformer", "model": "llama-2-7b", "seq_len": 2048, "micro_batch": 1, "steps": 10})
    e = estimate_option(job, hw, cat, strategy=Strategy.ZERO2)
    assert evolve(e, energy=None) == dataclasses.replace(e, energy=None) and e.energy is not None
    assert type(evolve(e, hint="x")) is type(e) and evolve(e, hint="x").hint == "x" and e.hint != "x"


def test_evolve_runs_the_checks_of_a_dataclass_that_has_them() -> None:
    """Layout validates its degrees in __post_init__: evolve goes through replace, which runs it."""
    with pytest.raises(Exception, match="tp"):
        evolve(Layout(gpus_per_node=8, nodes=1), tp=3)
    cat = get_catalog()
    hw = hardware_for_instance(find_instance("aws:p4d.24xlarge", cat), cat)
    with pytest.raises(TypeError):  # an unknown field is refused as replace refuses it
        evolve(hw, no_such_field=1)
