"""`trainplan report`: one valid, self-contained HTML file with the plan's and the run's plots."""

from __future__ import annotations

import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("plotly", reason="the report extra: pip install -e '.[report]'")

from trainplan import load_job  # noqa: E402
from trainplan.cli.main import main
from trainplan.report import figures as F
from trainplan.report.html import figure_options, plan_for, render_report, report_input

VOID = {"meta", "link", "br", "img", "input", "hr", "col", "source", "area", "base", "wbr", "embed", "track", "param"}


class Checker(HTMLParser):
    """Balanced tags, and every URL an element would load."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.loads: list[str] = []
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("src", "href"):
            if a.get(key):
                self.loads.append(f"{tag} {key}={a[key]}")
        if a.get("id"):
            self.ids.append(str(a["id"]))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else '-'}>")
        else:
            self.stack.pop()


def check(text: str) -> Checker:
    c = Checker()
    c.feed(text)
    c.close()
    assert not c.errors, c.errors[:5]
    assert not c.stack, f"unclosed: {c.stack}"
    return c


def figures_in(text: str) -> dict[str, dict[str, Any]]:
    """The plotly figures of the page by div id: Plotly.newPlot("id", data, layout, config)."""
    out = {}
    for m in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*(\[.*?\]),\s*(\{.*?\}),\s*\{"displaylogo"', text, flags=re.S):
        out[m.group(1)] = {"data": json.loads(m.group(2)), "layout": json.loads(m.group(3))}
    return out


def test_job_report_is_valid_and_self_contained(job_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(job_file), "-o", str(out)]) == 0
    text = out.read_text()
    c = check(text)
    assert c.loads == []  # nothing fetched: no <script src>, no <link href> at all
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)\s*=\s*[\"']?https?:", text, flags=re.I)
    assert F.plotly_js()[:500] in text  # the plotly.js bundle is inline
    assert {"job", "options", "rejected", "memory", "tradeoff"} <= set(c.ids)
    figs = figures_in(text)
    assert set(figs) == {"memory", "tradeoff"}


def test_plots_carry_the_plans_numbers(job_file: Path) -> None:
    job = load_job(job_file)
    plan = plan_for(job)
    figs = figures_in(render_report(report_input(job_file)))
    best = plan.options[0].to_dict()
    mem = {t["name"]: t for t in figs["memory"]["data"]}
    assert mem["weights"]["x"][0] == pytest.approx(best["memory"]["weights_gib"])
    assert mem["capacity"]["x"][0] == best["memory"]["capacity_gib"]
    assert sum(mem[label]["x"][0] for _, label, _ in F.CATEGORIES) == pytest.approx(best["memory"]["peak_gib"], rel=1e-6)
    assert "reserved" in mem  # the estimate has reserved_gib: the extra series shows
    trade = {t["name"]: t for t in figs["tradeoff"]["data"]}
    chosen = next(t for name, t in trade.items() if name.startswith("chosen"))
    assert (chosen["x"][0], chosen["y"][0]) == (pytest.approx(best["hours"]), pytest.approx(best["cost_usd"]))
    front = trade["Pareto front"]
    assert len(front["x"]) == len(plan.pareto) and front["x"] == sorted(front["x"])
    deadline, budget = trade["deadline 1 h"], trade["budget $30"]
    assert deadline["x"] == [1.0, 1.0] and budget["y"] == [30, 30]
    costs = [y for name, t in trade.items() if name not in ("deadline 1 h", "budget $30") for y in t["y"]]
    assert deadline["y"] == [min(costs + [30]), max(costs + [30])]  # the line spans the data
    assert "over deadline / budget" in trade  # options cut by the constraints are drawn, greyed


def test_memory_chart_without_allocator_figures(job_file: Path) -> None:
    mem, _, _ = figure_options(plan_for(load_job(job_file)))
    stripped = [F.Option(o.label, {**o.data, "memory": {k: v for k, v in o.data["memory"].items()
                                                          if k not in ("reserved_gib", "allocated_gib")}}, o.status, o.rank)
                for o in mem]  # fmt: skip
    names = [t.name for t in F.memory_figure(stripped).data]
    assert names == ["weights", "gradients", "optimizer state", "activations", "overhead", "capacity"]
    assert any(o.status == "rejected" for o in mem)  # memory-rejected options are drawn against capacity too


def test_run_dir_report_overlays_prediction(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    text = out.read_text()
    c = check(text)
    assert c.loads == []
    figs = figures_in(text)
    assert {"run-loss", "run-throughput", "run-steptime", "run-memory"} <= set(figs)
    loss = figs["run-loss"]["data"][0]
    assert loss["x"] == list(range(1, 21)) and loss["y"][3] == pytest.approx(0.5)  # the torn line is skipped
    thr = figs["run-throughput"]["layout"]["shapes"]
    assert [s["y0"] for s in thr] == [450.0]  # predicted rows/s as a line
    assert [s["y0"] for s in figs["run-steptime"]["layout"]["shapes"]] == [0.009]
    assert [t["name"] for t in figs["run-memory"]["data"]][0] == "measured allocated_gib"
    assert "<td>+22%</td>" in text  # measured vs predicted table


def test_bad_inputs_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: job file not found") and err.count("\n") == 1
    assert main(["report", str(tmp_path)]) == 2
    assert "is neither a job file nor a trainplan run directory" in capsys.readouterr().err


def test_missing_plotly_is_one_clear_line(job_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    assert main(["report", str(job_file), "-o", str(tmp_path / "x.html")]) == 2
    assert capsys.readouterr().err == "error: the HTML report needs plotly: pip install 'trainplan[report]'\n"
    assert not (tmp_path / "x.html").exists()


def test_report_never_overwrites_a_file_it_did_not_write(job_file: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    import os
    import stat

    before = job_file.read_text()
    assert main(["report", str(job_file), "-o", str(job_file)]) == 2
    err = capsys.readouterr().err
    assert "not a report trainplan wrote" in err and len(err.strip().splitlines()) == 1
    assert job_file.read_text() == before
    out = tmp_path / "r.html"
    assert main(["report", str(job_file), "-o", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()  # not mkstemp's 0600
    os.chmod(out, 0o640)
    assert main(["report", str(job_file), "-o", str(out)]) == 0  # its own report: replaced, mode kept
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    other = tmp_path / "notes.html"
    other.write_text("<html>mine</html>")
    assert main(["report", str(job_file), "-o", str(other)]) == 2
    assert main(["report", str(job_file), "-o", str(other), "--overwrite"]) == 0


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask
