"""`trainplan serve`'s endpoints through FastAPI's test client: same engine, same one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("fastapi", reason="the serve extra: pip install -e '.[serve,test]'")
pytest.importorskip("httpx", reason="FastAPI's test client needs httpx: pip install -e '.[test]'")
from fastapi.testclient import TestClient  # noqa: E402

from trainplan import SpecError, load_job, parse_job, plan_job
from trainplan.cli.main import main
from trainplan.serve.app import create_app
from trainplan.serve.forms import job_mapping

TINYLLAMA = {"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4,
             "num_hidden_layers": 22, "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 2048}  # fmt: skip


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(), base_url="http://localhost:8765")


def test_page_has_the_form(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    for name in ("preset", "hf_config", "method", "precision", "micro_batch", "seq_len", "strategy", "gpu", "gpus"):
        assert f"name='{name}'" in r.text
    assert '<script src="/static/plotly.min.js">' in r.text and "https://" not in r.text
    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and "plotly" in js.text[:400].lower()


def test_estimate_matches_the_library(client: TestClient) -> None:
    form = {"preset": "llama-7b", "method": "lora", "precision": "bf16", "micro_batch": "2", "seq_len": "1024",
            "strategy": "zero2", "gpu": "A100-80GB", "gpus": "4"}  # fmt: skip
    r = client.post("/api/estimate", json=form)
    assert r.status_code == 200, r.text
    a = r.json()
    d = a["detail"]
    assert (d["strategy"], d["accelerator"], d["count"], d["option"]) == ("zero2", "A100-80GB", 4, "4xA100-80GB")
    assert d["memory"]["peak_gib"] > 0 and {"weights_gib", "activations_gib", "reserved_gib"} <= set(d["memory"])
    plan = plan_job(parse_job(job_mapping(form)))
    assert a["fit"] == len(plan.options)
    assert [(o["option"], o["strategy"]) for o in a["options"]] == [(e.hardware.label, e.strategy) for e in plan.options[:15]]
    assert a["options"][0]["cost_usd"] == pytest.approx(plan.options[0].cost_usd)
    smaller = client.post("/api/estimate", json={**form, "micro_batch": "1"}).json()
    assert smaller["detail"]["memory"]["activations_gib"] < d["memory"]["activations_gib"]


@pytest.mark.parametrize("field,value", [("micro_batch", "-1"), ("precision", "fp4"), ("seq_len", "1.5"), ("method", "dora")])
def test_bad_value_is_the_specs_one_line_then_serving_goes_on(client: TestClient, field: str, value: str) -> None:
    r = client.post("/api/estimate", json={field: value})
    assert r.status_code == 422
    message = r.json()["error"]
    mapping = job_mapping({})
    mapping[field] = {"micro_batch": -1, "seq_len": 1.5}.get(field, value)
    with pytest.raises(SpecError) as exc:
        parse_job(mapping)
    assert message == str(exc.value) and message.startswith(f"{field}: ") and "\n" not in message
    assert client.post("/api/estimate", json={}).status_code == 200  # the server keeps serving


@pytest.mark.parametrize("form,start", [
    ({"gpu": "a100"}, "gpu: 'a100' is ambiguous"),
    ({"gpus": "0"}, "gpus: must be a whole number from 1 to 64"),
    ({"strategy": "zero9"}, "strategy: must be one of"),
    ({"hf_config": "{oops"}, "model: pasted config.json is not JSON"),
    ({"hf_config": "[1, 2]"}, "model: pasted config.json must be a JSON object"),
    ({"preset": "llama-8b"}, "preset: unknown preset (close: llama-"),
    ({"tokens": "inf"}, "tokens: must be a finite number"),
    ({"micro_bach": "4"}, "micro_bach: unknown field"),
])  # fmt: skip
def test_other_bad_values(client: TestClient, form: dict[str, str], start: str) -> None:
    r = client.post("/api/estimate", json=form)
    assert r.status_code == 422 and r.json()["error"].startswith(start), r.text


def test_body_that_is_not_a_form(client: TestClient) -> None:
    r = client.post("/api/estimate", content=b"not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"].startswith("request body: not a JSON object")


def test_pasted_config_and_export_round_trip(client: TestClient, tmp_path: Path) -> None:
    form = {"hf_config": json.dumps(TINYLLAMA), "method": "qlora", "gpu": "RTX4090", "gpus": "1", "name": "tiny-llama"}
    a = client.post("/api/estimate", json=form).json()
    assert a["job"]["model"]["hidden"] == 2048 and a["job"]["model"]["kv_heads"] == 4
    assert a["detail"]["fits"] and a["detail"]["strategy"] == "single"
    r = client.post("/api/job.yaml", json=form)
    assert r.status_code == 200 and r.headers["content-disposition"] == 'attachment; filename="tiny-llama.yaml"'
    path = tmp_path / "exported.yaml"
    path.write_text(r.text)
    assert yaml.safe_load(r.text) == a["job"]
    assert load_job(path) == parse_job(a["job"])
    assert client.post("/api/job.yaml", json={"micro_batch": "0"}).json()["error"].startswith("micro_batch: ")


def test_serve_without_the_extra_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert main(["serve", "--port", "8999"]) == 2
    err = capsys.readouterr().err
    assert err == "error: trainplan serve needs FastAPI and uvicorn (uvicorn is missing): pip install 'trainplan[serve]'\n"


def test_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --port: cannot listen on 127.0.0.1:{port}: ")


def test_serve_cli_binds_loopback_by_default() -> None:
    import inspect

    from trainplan.cli.serve import serve_command

    assert inspect.signature(serve_command).parameters["host"].default == "127.0.0.1"


def test_the_page_refuses_other_hosts_big_bodies_and_server_paths(client: TestClient) -> None:
    """DNS rebinding (a foreign Host), an oversized body, and a preset that is a path on the server."""
    rebound = TestClient(create_app(), base_url="http://evil.example:8765")
    assert rebound.get("/").status_code == 400 and rebound.post("/api/estimate", json={}).status_code == 400
    huge = client.post("/api/estimate", json={"name": "x" * (300 * 1024)})
    assert huge.status_code == 413 and "larger than 256 KiB" in huge.json()["error"]
    for path in ("/etc/shadow", "/etc/passwd", "/nonexistent/config.json", "."):
        r = client.post("/api/estimate", json={"preset": path})
        assert r.status_code == 422 and r.json()["error"].startswith("preset: unknown preset")
        assert "shadow" not in r.text and "exist" not in r.text  # nothing about the server's files
    assert client.post("/api/estimate", json={"preset": "llama-7b"}).status_code == 200
    bound = TestClient(create_app(allowed_hosts=("localhost", "10.0.0.5")), base_url="http://10.0.0.5:8765")
    assert bound.get("/").status_code == 200  # serve --host 10.0.0.5 answers its own address too


def test_estimate_takes_an_html_form_post_and_offers_tpus(client: TestClient) -> None:
    as_json = client.post("/api/estimate", json={"micro_batch": "2", "gpu": "A100-80GB", "gpus": "4"}).json()
    as_form = client.post("/api/estimate", data={"micro_batch": "2", "gpu": "A100-80GB", "gpus": "4"})
    assert as_form.status_code == 200 and as_form.json()["options"] == as_json["options"]
    tpus = [g for g in client.get("/api/choices").json()["choices"]["gpu"] if g.startswith("TPU")]
    assert tpus
    r = client.post("/api/estimate", json={"gpu": tpus[0], "gpus": "8"})
    assert r.status_code == 200, r.text
    bad = client.post("/api/estimate", content=b"not json", headers={"content-type": "text/plain"})
    assert bad.status_code == 422 and bad.json()["error"].startswith("request body:")
