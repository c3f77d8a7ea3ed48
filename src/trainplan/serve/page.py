"""The HTML of the planning page: a form, the memory breakdown (numbers and a stacked bar), the ranked options.

The script posts the form to ``/api/estimate`` a moment after each change and redraws; a bad value shows the
server's one-line error above the results (the last good numbers stay, greyed).  plotly.js comes from this
server (``/static/plotly.min.js``), never from a CDN.
"""

from __future__ import annotations

import html
import json
from typing import Any, Mapping, Sequence

CATEGORIES = (("weights_gib", "weights", "#4c78a8"), ("gradients_gib", "gradients", "#f58518"),
              ("optimizer_gib", "optimizer state", "#54a24b"), ("activations_gib", "activations", "#e45756"),
              ("overhead_gib", "overhead", "#9d755d"))  # fmt: skip


def _select(name: str, values: Sequence[str], chosen: Any, label: str) -> str:
    opts = "".join(
        f"<option value='{html.escape(v, quote=True)}'{' selected' if v == str(chosen) else ''}>{html.escape(v)}</option>"
        for v in values
    )
    return f"<label>{html.escape(label)}<select name='{name}' id='f-{name}'>{opts}</select></label>"


def _input(name: str, value: Any, label: str, *, kind: str = "text", placeholder: str = "") -> str:
    v = "" if value is None else html.escape(str(value), quote=True)
    return (f"<label>{html.escape(label)}<input type='{kind}' name='{name}' id='f-{name}' value='{v}' "
            f"placeholder='{html.escape(placeholder, quote=True)}'></label>")  # fmt: skip


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f3b57;color:#fff;padding:.7rem 1.2rem}header h1{font-size:1.2rem;margin:0}
main{display:grid;grid-template-columns:320px 1fr;gap:1rem;padding:1rem}
form{background:#fff;padding:1rem;border:1px solid #ddd;border-radius:6px}
label{display:block;font-size:.8rem;color:#555;margin-bottom:.6rem}
input,select,textarea{display:block;width:100%;box-sizing:border-box;font-size:.9rem;padding:.3rem;margin-top:.15rem}
textarea{height:6rem;font-family:monospace;font-size:.75rem}
section{background:#fff;padding:1rem;border:1px solid #ddd;border-radius:6px;margin-bottom:1rem}
table{border-collapse:collapse;width:100%;font-size:.85rem}th,td{border-bottom:1px solid #eee;padding:.25rem .5rem;text-align:left}
th{background:#f6f6f6}td.num{text-align:right}
#error{display:none;background:#fde2e1;color:#8a1c1c;border:1px solid #f5a9a6;padding:.5rem .8rem;border-radius:4px;margin-bottom:1rem}
.stale{opacity:.45}.verdict{font-size:1.1rem;font-weight:600}button{padding:.45rem .9rem;font-size:.9rem}
#export-status{font-size:.8rem;color:#555;margin-left:.5rem}
"""

SCRIPT = r"""
const CATS = __CATEGORIES__;
const form = document.getElementById('form');
const errBox = document.getElementById('error');
const results = document.getElementById('results');
let seq = 0, timer = null;

function formData() {
  const out = {};
  for (const el of form.elements) { if (el.name) out[el.name] = el.value; }
  return out;
}
function gib(v) { return v == null ? '–' : v.toFixed(2); }
function hours(h) { if (h == null) return '–'; return h < 1 ? (h * 60).toFixed(0) + ' min' : h.toFixed(1) + ' h'; }
function usd(c) { return c == null ? '–' : '$' + c.toLocaleString(undefined, {maximumFractionDigits: 2}); }
function esc(s) { return String(s).replace(/[&<>"']/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c])); }

function showError(msg) {
  errBox.textContent = msg; errBox.style.display = 'block'; results.classList.add('stale');
}
function clearError() { errBox.textContent = ''; errBox.style.display = 'none'; results.classList.remove('stale'); }

function render(a) {
  const d = a.detail, m = d.memory;
  document.getElementById('verdict').textContent = d.fits ? d.verdict : 'does not fit: ' + (d.reason || d.verdict);
  document.getElementById('d-option').textContent = d.option + ' · ' + d.strategy;
  document.getElementById('d-peak').textContent = gib(m.peak_gib) + ' of ' + gib(m.capacity_gib) + ' GiB (peak at ' + m.peak_phase + ')';
  document.getElementById('d-step').textContent = d.step_time_s == null ? '–' : d.step_time_s.toFixed(3) + ' s';
  document.getElementById('d-time').textContent = hours(d.hours);
  document.getElementById('d-cost').textContent = usd(d.cost_usd);
  for (const [key] of CATS) document.getElementById('m-' + key).textContent = gib(m[key]);
  const extra = ['allocated_gib', 'reserved_gib'].filter(k => m[k] != null);
  document.getElementById('m-extra').textContent = extra.map(k => k.replace('_gib', '') + ' ' + gib(m[k]) + ' GiB').join(' · ');
  drawMemory(m);
  const rows = a.options.map(o => '<tr><td>' + o.rank + '</td><td>' + esc(o.option) + (o.this_machine ? ' (this machine)' : '') +
    '</td><td>' + esc(o.devices) + '</td><td>' + esc(o.strategy) + '</td><td class=num>' + o.peak_gib.toFixed(1) + ' / ' +
    o.capacity_gib.toFixed(0) + '</td><td class=num>' + hours(o.hours) + '</td><td class=num>' + usd(o.cost_usd) + '</td><td>' +
    (o.pareto ? 'pareto' : '') + '</td></tr>').join('');
  document.getElementById('options-body').innerHTML = rows;
  document.getElementById('options-title').textContent = a.fit + ' catalog options fit (' + a.rejected + ' rejected); the best ' + a.options.length + ':';
  document.getElementById('warnings').textContent = a.warnings.join(' ');
}

function drawMemory(m) {
  const el = document.getElementById('memchart');
  if (!window.Plotly) { el.textContent = 'plotly.js is not available; the numbers above are complete.'; return; }
  const traces = CATS.map(([key, label, color]) => ({type: 'bar', orientation: 'h', name: label, y: ['per device'],
    x: [m[key]], marker: {color: color}, hovertemplate: label + ': %{x:.2f} GiB<extra></extra>'}));
  traces.push({type: 'scatter', mode: 'markers', name: 'capacity', y: ['per device'], x: [m.capacity_gib],
    marker: {symbol: 'line-ns-open', size: 40, line: {width: 3}, color: '#000'}});
  for (const [k, sym] of [['allocated_gib', 'diamond'], ['reserved_gib', 'triangle-left']]) {
    if (m[k] != null) traces.push({type: 'scatter', mode: 'markers', name: k.replace('_gib', ''), y: ['per device'], x: [m[k]],
      marker: {symbol: sym, size: 12}});
  }
  Plotly.react(el, traces, {barmode: 'stack', height: 220, margin: {l: 80, r: 10, t: 10, b: 40}, template: 'plotly_white',
    xaxis: {title: 'GiB'}, legend: {orientation: 'h', y: -0.4}}, {displaylogo: false, responsive: true});
}

async function update() {
  const mine = ++seq;
  let resp, body;
  try {
    resp = await fetch('/api/estimate', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(formData())});
    body = await resp.json();
  } catch (e) { if (mine === seq) showError('the trainplan server did not answer: ' + e); return; }
  if (mine !== seq) return;  // a newer request is on its way
  if (!resp.ok) { showError(body.error || ('error ' + resp.status)); return; }
  clearError(); render(body);
  document.body.dataset.updates = String((+document.body.dataset.updates || 0) + 1);
}
function schedule() { clearTimeout(timer); timer = setTimeout(update, 200); }
form.addEventListener('input', schedule);
form.addEventListener('change', schedule);
form.addEventListener('submit', e => { e.preventDefault(); update(); });

document.getElementById('export').addEventListener('click', async () => {
  const status = document.getElementById('export-status');
  const resp = await fetch('/api/job.yaml', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(formData())});
  if (!resp.ok) { const b = await resp.json(); showError(b.error); status.textContent = ''; return; }
  const text = await resp.text();
  const name = (resp.headers.get('Content-Disposition') || '').match(/filename="([^"]+)"/);
  const a = document.createElement('a');
  a.href = URL.createObjectURL(new Blob([text], {type: 'application/yaml'}));
  a.download = name ? name[1] : 'job.yaml';
  document.body.appendChild(a); a.click(); a.remove();
  status.textContent = 'exported ' + a.download + ' (' + text.length + ' bytes)';
});
update();
"""


def page_html(choices: Mapping[str, Sequence[str]], defaults: Mapping[str, Any]) -> str:
    """The whole page; ``choices`` fill the selects and ``defaults`` the inputs."""
    fields = "".join([
        _input("name", defaults["name"], "job name"),
        _select("preset", choices["preset"], defaults["preset"], "model preset"),
        "<label>or paste a Hugging Face config.json (used instead of the preset)"
        "<textarea name='hf_config' id='f-hf_config' placeholder='{\"model_type\": \"llama\", \"hidden_size\": 4096, …}'></textarea></label>",
        _select("method", choices["method"], defaults["method"], "method"),
        _select("precision", choices["precision"], defaults["precision"], "precision"),
        _input("micro_batch", defaults["micro_batch"], "micro-batch (per device)", kind="number"),
        _input("seq_len", defaults["seq_len"], "sequence length", kind="number"),
        _input("global_batch", None, "global batch (optional)", kind="number", placeholder="one micro-batch per device"),
        _input("tokens", defaults["tokens"], "training tokens"),
        _select("strategy", choices["strategy"], defaults["strategy"], "strategy"),
        _select("gpu", choices["gpu"], defaults["gpu"], "GPU"),
        _input("gpus", defaults["gpus"], "GPUs", kind="number"),
    ])  # fmt: skip
    mem_rows = "".join(f"<tr><td>{html.escape(label)}</td><td class=num id='m-{key}'>–</td></tr>" for key, label, _ in CATEGORIES)
    script = SCRIPT.replace("__CATEGORIES__", json.dumps([list(c) for c in CATEGORIES]))
    return f"""<!DOCTYPE html>
<html lang=en><head><meta charset=utf-8><meta name=viewport content='width=device-width, initial-scale=1'>
<title>trainplan</title><link rel=icon href="data:,"><style>{STYLE}</style><script src="/static/plotly.min.js"></script></head>
<body data-updates=0>
<header><h1>trainplan — memory, time and cost of a training job</h1></header>
<main>
<form id=form autocomplete=off>{fields}
<button type=button id=export>Export job file (YAML)</button><span id=export-status></span></form>
<div>
<div id=error role=alert></div>
<div id=results>
<section><div class=verdict id=verdict>…</div>
<table><tbody>
<tr><td>option</td><td id=d-option>–</td></tr><tr><td>memory per device</td><td id=d-peak>–</td></tr>
<tr><td>step time</td><td id=d-step>–</td></tr><tr><td>training time</td><td id=d-time>–</td></tr><tr><td>cost</td><td id=d-cost>–</td></tr>
</tbody></table></section>
<section><h3>Memory per device (GiB)</h3><table id=breakdown><tbody>{mem_rows}</tbody></table>
<p id=m-extra></p><div id=memchart></div></section>
<section><h3 id=options-title>Ranked options</h3><p id=warnings></p>
<table id=options><thead><tr><th>#</th><th>option</th><th>devices</th><th>strategy</th><th>GiB/dev</th><th>time</th><th>cost</th><th></th></tr></thead>
<tbody id=options-body></tbody></table></section>
</div></div></main>
<script>{script}</script>
</body></html>
"""
