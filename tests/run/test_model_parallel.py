"""Tensor + sequence parallel, pipeline parallel (1F1B and interleaved) and 2-D tensor × FSDP runs of a small Llama on
CPU over gloo (trainplan.run.runtime.model_parallel): each layout's loss and every gradient equal one process on the
same batch.  Tolerance: 1e-5 relative on the loss, 1e-5 of each gradient's largest element (fp32; the sums are
reordered across ranks)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch.distributed.pipelining")

SUPPORT = Path(__file__).parent / "model_parallel_support.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("case", "procs"), [("tp", 2), ("tp-sp", 2), ("pp", 2), ("pp-interleaved", 2), ("tp-fsdp", 4)])
def test_layout_trains_like_one_process(case: str, procs: int, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs), "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()),
           str(SUPPORT), case, str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers: none may outlive the test
        proc.communicate()
        raise
    assert proc.returncode == 0, stderr[-3000:]
    ranks = json.loads(out.read_text())
    assert len(ranks) == procs
    for r in ranks:
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)
        assert r["worst_grad_rel"] < 1e-5
        assert r["grads"] > 0
    if case.startswith("pp"):
        # each stage holds only its own blocks' parameters: together they cover the model once
        assert sum(r["grads"] for r in ranks) == 39
