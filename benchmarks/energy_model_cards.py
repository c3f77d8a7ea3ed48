"""Energy and CO2 of published training runs: the model cards' own figures against trainplan's model.

    python benchmarks/energy_model_cards.py

For each run, the card gives GPU-hours, a per-GPU power (Meta: "peak power capacity per GPU device ...
adjusted for power usage efficiency") and tCO2eq.  trainplan's model (estimate/energy.py) for the same
GPU-hours on the catalog's 8-GPU instance of that GPU in its region: board power × utilisation 1.0 + the host's
share, × the cloud's PUE, × the region's grid intensity.  Printed as a Markdown table (docs/benchmarks.md).
"""

from __future__ import annotations

from trainplan.catalog import find_instance, get_catalog
from trainplan.estimate.energy import option_energy
from trainplan.estimate.hardware import hardware_for_instance

# name, GPU-hours, card W per GPU, card tCO2eq, catalog instance (source: the model cards, see tests/estimate/test_energy.py)
RUNS = [
    ("Llama 2 7B", 184_320, 400, 31.22, "p4de.24xlarge"),
    ("Llama 2 13B", 368_640, 400, 62.44, "p4de.24xlarge"),
    ("Llama 2 70B", 1_720_320, 400, 291.42, "p4de.24xlarge"),
    ("Llama 3 8B", 1.3e6, 700, 390, "p5.48xlarge"),
    ("Llama 3 70B", 6.4e6, 700, 1900, "p5.48xlarge"),
]


def main() -> None:
    cat = get_catalog()
    print("| run | GPU-h | card MWh (h × W) | card tCO2eq | card kg/kWh | trainplan MWh | trainplan tCO2eq | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, gpu_h, watts, t, inst in RUNS:
        hw = hardware_for_instance(find_instance(inst, cat), cat)
        e = option_energy(hw, cat, train_s=gpu_h / hw.layout.world_size * 3600, startup_s=0.0, utilisation=1.0)
        card_mwh = gpu_h * watts / 1e6
        print(f"| {name} | {gpu_h:,.0f} | {card_mwh:,.0f} | {t:,.0f} | {t / card_mwh:.3f} | {e.kwh / 1000:,.0f} "
              f"| {e.co2_kg / 1000:,.0f} | {e.co2_kg / 1000 / t:.2f} |")
    print(f"\n(trainplan: {inst} in {e.region}, PUE {e.pue}, grid {e.grid_kg_co2e_per_kwh} kg/kWh, host {e.host_w:.0f} W per node)")


if __name__ == "__main__":
    main()
