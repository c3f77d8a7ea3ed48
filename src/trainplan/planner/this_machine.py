""""This machine" as a plan option, with the figures ``trainplan probe`` measured here.

After ``trainplan probe`` has saved a hardware profile (:mod:`trainplan.measure.profile`), every plan
also weighs the machine it runs on, labelled ``local:this-machine`` and priced at zero (it is owned;
its price note says so and names the probe's date).  What comes from the measurement:

* memory: host RAM and each GPU's memory as the probe read them;
* a GPU the catalog knows keeps its datasheet peaks — the efficiency assumptions are fractions of
  those — with the memory bandwidth replaced by the measured device copy bandwidth ÷
  ``mem_bw_efficiency`` (the estimator multiplies it back); an unknown GPU takes its measured
  matmul rates as peaks;
* several GPUs: the intra-node bandwidth is the measured NCCL all-reduce bus bandwidth ÷
  ``comm_bw_efficiency``, the inverse of :func:`trainplan.estimate.steptime.links_for`;
* tabular jobs: the measured per-core rate of the job's library (:func:`measured_rate_lookup`, given to
  the estimator as its ``efficiency_for``).

Without a profile made on this host nothing is added.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterator

from trainplan.catalog import Accelerator, Catalog, Instance
from trainplan.estimate.hardware import Hardware, hardware_for_instance
from trainplan.measure.profile import HardwareProfile, profile_for_this_machine
from trainplan.spec import Job, TabularJob
from trainplan.strategies import Strategy, strategies_for

THIS_MACHINE = "this-machine"
_DTYPES = ("bf16", "fp16", "tf32", "fp32")


def is_this_machine(hw: Hardware) -> bool:
    """Whether ``hw`` is the option this module made."""
    return hw.instance is not None and hw.instance.cloud == "local" and hw.instance.name == THIS_MACHINE


def _gpu_accelerator(profile: HardwareProfile, catalog: Catalog) -> Accelerator | None:
    m = profile.machine
    gpus = m.get("gpus") or []
    if m.get("accelerator") != "cuda" or not gpus:
        return None
    first = gpus[0]
    measured_bw = profile.figure("device_memory_bandwidth")
    bw_eff = catalog.assumption("mem_bw_efficiency")
    known = catalog.accelerators.get(str(first.get("canonical_id")))
    probe = f"trainplan probe on {profile.host}, {profile.date}"
    if known is not None:
        rates = [f"{dt} {profile.figure(f'matmul_{dt}_cuda'):.0f} TFLOP/s" for dt in _DTYPES if profile.figure(f"matmul_{dt}_cuda")]
        return replace(
            known,
            memory_gib=float(first["memory_gib"]),
            mem_bandwidth_gb_s=measured_bw / bw_eff if measured_bw else known.mem_bandwidth_gb_s,
            source=(f"{probe}: memory and bandwidth measured; peaks from the datasheet ({known.source}); "
                    f"measured matmul {', '.join(rates) or 'not measured'}"),  # fmt: skip
            as_of=profile.date,
        )
    peaks = {dt: profile.figure(f"matmul_{dt}_cuda") for dt in _DTYPES}
    if not any(peaks.values()) or not measured_bw:
        return None  # an unknown GPU without measurements: nothing to estimate with
    return Accelerator(
        id=str(first.get("canonical_id") or first.get("name")),
        vendor="nvidia",
        kind="gpu",
        memory_gib=float(first["memory_gib"]),
        peak_bf16_tflops=peaks["bf16"],
        peak_fp16_tflops=peaks["fp16"],
        peak_fp32_tflops=peaks["fp32"],
        peak_tf32_tflops=peaks["tf32"],
        mem_bandwidth_gb_s=measured_bw / bw_eff,
        source=f"{probe}: not in the catalog; peaks are the measured matmul rates",
        as_of=profile.date,
    )


def _interconnect(profile: HardwareProfile) -> str:
    links = (profile.machine.get("nvml") or {}).get("links") or []
    kinds = {str(link.get("kind")) for link in links}
    if not kinds:
        return "none"
    return "nvlink" if kinds == {"nvlink"} else "pcie" if "nvlink" not in kinds else "mixed"


def this_machine_instance(profile: HardwareProfile, catalog: Catalog) -> tuple[Instance, Accelerator | None]:
    """A catalog-style instance row for this machine, and its (measured) accelerator."""
    m = profile.machine
    acc = _gpu_accelerator(profile, catalog)
    count = len(m.get("gpus") or []) if acc is not None else 0
    intra = None
    busbw = profile.measurement("allreduce_bus_bandwidth")
    if acc is not None and count > 1 and busbw is not None and busbw.value and busbw.device.startswith("cuda"):
        intra = busbw.value / catalog.assumption("comm_bw_efficiency")
    inst = Instance(
        cloud="local",
        name=THIS_MACHINE,
        region=profile.host,
        vcpus=int(m.get("cpu_cores") or 1),
        ram_gib=float(m.get("memory_gib") or 0.0),
        accelerator=acc.id if acc else None,
        accelerator_count=count,
        interconnect=_interconnect(profile) if count > 1 else "none",
        intra_node_bw_gb_s=intra,
        network_gbps=None,
        price_usd_per_h=0.0,
        spot_price_usd_per_h=None,
        cpu_model=str(m.get("cpu_model") or ""),
        source=f"trainplan probe on {profile.host}, {profile.date}",
        as_of=profile.date,
    )
    return inst, acc


def this_machine_hardware(profile: HardwareProfile, catalog: Catalog) -> Hardware:
    """This machine as an option's hardware (owned: price 0, and the price note says where the figures come from)."""
    inst, acc = this_machine_instance(profile, catalog)
    hw = hardware_for_instance(inst, catalog)
    note = f"this machine ({profile.host}), measured by trainplan probe {profile.date}; owned, not priced"
    return replace(hw, accelerator=acc, price_note=note)


def this_machine_candidates(job: Job, catalog: Catalog, profile: HardwareProfile | None = None) -> Iterator[tuple[Hardware, Strategy | None]]:
    """This machine's options for ``job`` when a profile made here exists and the job allows local hardware."""
    c = job.constraints
    if not c.allows("local"):
        return
    prof = profile or profile_for_this_machine()
    if prof is None:
        return
    hw = this_machine_hardware(prof, catalog)
    if hw.accelerator is not None and hw.layout.world_size > c.max_gpus:
        return
    if isinstance(job, TabularJob):
        yield hw, None
        return
    if hw.accelerator is None:  # a neural job on CPUs only: one option, rejected with its reason
        yield hw, Strategy.SINGLE
        return
    for strategy in strategies_for(hw.layout.world_size):
        yield hw, strategy


def probed_tabular_rate(job: Job, profile: HardwareProfile | None = None, *, hardware_id: str | None = None) -> float | None:
    """The per-core rate ``trainplan probe`` measured for a tabular job's library on this machine (ns per unit of
    work, tabular_rates.csv's unit), or None: not a tabular job, no profile of this machine, a ``hardware_id``
    (``cpu:<model>:<cores>``) that is not the profiled CPU, or a rate probed under an earlier cost model (another
    unit: probe again)."""
    if not isinstance(job, TabularJob):
        return None
    from trainplan.measure.microbench import tabular_rate_unit
    from trainplan.measure.probe import cpu_hardware_id

    prof = profile or profile_for_this_machine()
    if prof is not None and hardware_id is not None and hardware_id != cpu_hardware_id(
            str(prof.machine.get("cpu_model", "")), int(prof.machine.get("cpu_cores", 0) or 0)):
        return None
    measured = prof.measurement(f"tabular_{job.library.value}") if prof is not None else None
    return measured.value if measured is not None and measured.unit == tabular_rate_unit(job.library.value) else None


def measured_rate_lookup(job: Job, profile: HardwareProfile | None = None,
                         fallback: Callable[[Hardware], float | None] | None = None) -> Callable[[Hardware], Any] | None:  # fmt: skip
    """An ``efficiency_for`` giving the probe's per-core rate for a tabular job on this machine's CPUs,
    and ``fallback``'s answer for every other option (None without a profile or a measured rate)."""
    rate = probed_tabular_rate(job, profile)
    if rate is None:
        return fallback

    def lookup(hw: Hardware) -> float | None:
        if is_this_machine(hw) and hw.accelerator is None:
            return rate
        return fallback(hw) if fallback else None

    return lookup
