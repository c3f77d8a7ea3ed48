"""The report's plots, built with plotly (the ``report`` extra): each function returns a plotly Figure.

Inputs are plain rows (``Estimate.to_dict()`` objects and metric lines), so the same figures serve a
plan, a run and tests.  Memory bars stack the categories of the estimate's breakdown (they add up to
the peak) against the device's capacity; where the estimate also gives ``allocated_gib`` /
``reserved_gib`` (the caching allocator's view) they are drawn as markers beside the bar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from trainplan.errors import TrainplanError

CATEGORIES = (
    ("weights_gib", "weights", "#4c78a8"),
    ("gradients_gib", "gradients", "#f58518"),
    ("optimizer_gib", "optimizer state", "#54a24b"),
    ("activations_gib", "activations", "#e45756"),
    ("overhead_gib", "overhead", "#9d755d"),
)
#: optional series: drawn when some option's memory has the key (the allocator's view of the peak)
MARKERS = (
    ("allocated_gib", "allocated", "diamond", "#222222"),
    ("reserved_gib", "reserved", "triangle-left", "#7b3294"),
)
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def plotly() -> Any:
    """``plotly.graph_objects``, or one clear error naming the extra to install."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise TrainplanError("the HTML report needs plotly: pip install 'trainplan[report]'") from None
    return go


@dataclass(frozen=True)
class Option:
    """One option as the figures see it: its label, its ``Estimate.to_dict()`` and how the plan judged it."""

    label: str
    data: dict[str, Any]
    status: str  # "option" | "rejected" | "over-constraint"
    rank: int | None = None
    pareto: bool = False


def _layout(fig: Any, title: str, **kw: Any) -> Any:
    fig.update_layout(title=title, template="plotly_white", margin={"l": 10, "r": 10, "t": 50, "b": 40},
                      legend={"orientation": "h", "y": -0.15}, **kw)  # fmt: skip
    return fig


def memory_figure(options: Sequence[Option]) -> Any:
    """Stacked per-device memory by category for each option, against the device's capacity."""
    go = plotly()
    names = [f"#{o.rank} {o.label}" if o.rank else f"✗ {o.label}" for o in options]
    fig = go.Figure()
    for key, label, color in CATEGORIES:
        fig.add_bar(y=names, x=[o.data["memory"].get(key, 0.0) for o in options], name=label, orientation="h",
                    marker_color=color, hovertemplate=f"{label}: %{{x:.2f}} GiB<extra>%{{y}}</extra>")  # fmt: skip
    fig.add_scatter(y=names, x=[o.data["memory"].get("capacity_gib") for o in options], mode="markers", name="capacity",
                    marker={"symbol": "line-ns-open", "size": 22, "line": {"width": 3}, "color": "#000000"},
                    hovertemplate="capacity %{x:.1f} GiB<extra>%{y}</extra>")  # fmt: skip
    for key, label, symbol, color in MARKERS:
        values = [o.data["memory"].get(key) for o in options]
        if any(v is not None for v in values):
            fig.add_scatter(y=names, x=values, mode="markers", name=label, marker={"symbol": symbol, "size": 10, "color": color},
                            hovertemplate=f"{label} %{{x:.2f}} GiB<extra>%{{y}}</extra>")  # fmt: skip
    height = max(320, 60 + 28 * len(options))
    return _layout(fig, "Memory per device by category (GiB) against capacity", barmode="stack", height=height,
                   yaxis={"autorange": "reversed", "automargin": True}, xaxis={"title": "GiB per device"})  # fmt: skip


def _positive_log(values: Sequence[float]) -> str:
    return "log" if values and min(values) > 0 else "linear"


def tradeoff_figure(options: Sequence[Option], *, deadline_hours: float | None, budget_usd: float | None,
                    chosen: Option | None) -> Any:  # fmt: skip
    """Time vs cost of every option, the Pareto front, the deadline and budget lines, the chosen option."""
    go = plotly()
    fig = go.Figure()

    def points(group: Sequence[Option], name: str, marker: dict[str, Any]) -> None:
        if not group:
            return
        fig.add_scatter(
            x=[o.data["hours"] for o in group], y=[o.data["cost_usd"] for o in group], mode="markers", name=name,
            marker=marker, text=[f"{o.label} · {o.data['strategy']}" for o in group],
            hovertemplate="%{text}<br>%{x:.2f} h, $%{y:,.2f}<extra></extra>",
        )  # fmt: skip

    ok = [o for o in options if o.status == "option"]
    over = [o for o in options if o.status == "over-constraint"]
    points([o for o in ok if not o.pareto], "option", {"color": "#4c78a8", "size": 7, "opacity": 0.6})
    points(over, "over deadline / budget", {"color": "#bbbbbb", "size": 7, "symbol": "x"})
    front = sorted((o for o in ok if o.pareto), key=lambda o: o.data["hours"])
    if front:
        fig.add_scatter(x=[o.data["hours"] for o in front], y=[o.data["cost_usd"] for o in front], mode="lines+markers",
                        name="Pareto front", line={"color": "#e45756", "shape": "hv"}, marker={"size": 9, "color": "#e45756"},
                        text=[f"{o.label} · {o.data['strategy']}" for o in front],
                        hovertemplate="%{text}<br>%{x:.2f} h, $%{y:,.2f}<extra>Pareto</extra>")  # fmt: skip
    if chosen is not None:
        fig.add_scatter(x=[chosen.data["hours"]], y=[chosen.data["cost_usd"]], mode="markers", name=f"chosen: {chosen.label}",
                        marker={"symbol": "star", "size": 18, "color": "#f2b701", "line": {"width": 1, "color": "#000"}},
                        hovertemplate=f"chosen: {chosen.label} · {chosen.data['strategy']}<br>%{{x:.2f}} h, $%{{y:,.2f}}<extra></extra>")  # fmt: skip
    shown = ok + over
    xs = [o.data["hours"] for o in shown] + ([deadline_hours] if deadline_hours else [])
    ys = [o.data["cost_usd"] for o in shown] + ([budget_usd] if budget_usd else [])
    # constraint lines as traces spanning the data (shapes on log axes would need log10 coordinates)
    if deadline_hours is not None and ys:
        fig.add_scatter(x=[deadline_hours, deadline_hours], y=[min(ys), max(ys)], mode="lines", name=f"deadline {deadline_hours:g} h",
                        line={"dash": "dash", "color": "#7b3294"}, hoverinfo="name")  # fmt: skip
    if budget_usd is not None and xs:
        fig.add_scatter(x=[min(xs), max(xs)], y=[budget_usd, budget_usd], mode="lines", name=f"budget ${budget_usd:,.0f}",
                        line={"dash": "dash", "color": "#2ca02c"}, hoverinfo="name")  # fmt: skip
    return _layout(fig, "Time vs cost (each point an option)", height=480,
                   xaxis={"title": "hours (training + start-up)", "type": _positive_log(xs)},
                   yaxis={"title": "cost, USD", "type": _positive_log(ys)})  # fmt: skip


def curve_figure(steps: Sequence[dict[str, Any]], key: str, title: str, unit: str, *, predicted: float | None = None,
                 extra_keys: Sequence[str] = ()) -> Any:  # fmt: skip
    """One measured series per step (``key`` and ``extra_keys`` of the metric lines), the prediction as a line."""
    go = plotly()
    fig = go.Figure()
    for k in (key, *extra_keys):
        rows = [r for r in steps if r.get(k) is not None]
        fig.add_scatter(x=[r["step"] for r in rows], y=[r[k] for r in rows], mode="lines+markers", name=f"measured {k}",
                        marker={"size": 4})  # fmt: skip
    if predicted is not None:
        fig.add_hline(y=predicted, line_dash="dash", line_color="#e45756", annotation_text=f"predicted {predicted:,.4g} {unit}",
                      annotation_position="top left")  # fmt: skip
        fig.add_scatter(x=[None], y=[None], mode="lines", name="predicted", line={"dash": "dash", "color": "#e45756"})
    return _layout(fig, title, height=340, xaxis={"title": "step"}, yaxis={"title": unit})


def peak_figure(measured_gib: float | None, predicted_gib: float | None, capacity_gib: float | None = None) -> Any:
    """Measured against predicted peak memory (when the metric lines carry no per-step memory)."""
    go = plotly()
    fig = go.Figure()
    fig.add_bar(x=["measured peak", "predicted peak"], y=[measured_gib, predicted_gib], marker_color=["#4c78a8", "#e45756"],
                text=[f"{v:.3f} GiB" if v is not None else "not predicted" for v in (measured_gib, predicted_gib)],
                textposition="auto", name="peak memory")  # fmt: skip
    if capacity_gib:
        fig.add_hline(y=capacity_gib, line_dash="dot", annotation_text=f"capacity {capacity_gib:.1f} GiB")
    return _layout(fig, "Peak memory: measured vs predicted (GiB)", height=320, yaxis={"title": "GiB"}, showlegend=False)


def figure_html(fig: Any, div_id: str) -> str:
    """A figure as a ``<div>`` + inline script (plotly.js itself is included once by the page)."""
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG))


def plotly_js() -> str:
    """The plotly.js bundle shipped inside the plotly package (inlined: the report opens offline)."""
    plotly()
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())
