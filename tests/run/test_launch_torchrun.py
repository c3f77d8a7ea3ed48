"""`trainplan launch --to torchrun`, two nodes simulated on this machine: two torchrun agents on localhost
(node ranks 0 and 1) meet through the c10d rendezvous and train the tiny model together; a killed worker
makes both agents restart the group, which resumes from the checkpoint and ends with the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TORCH_JOB, assert_same_weights, child_pythonpath, write_job
from launch_support import events, free_port, logs, processes, records, render_to

pytestmark = pytest.mark.slow

TWO_NODES = dict(gpu="A100-80GB", gpus=1, nodes=2, strategy="ddp", device="cpu", checkpoint_every=4)


def _launch(job: Path, out: Path, fault: dict[str, str] | None = None) -> tuple[list[list[str]], list[int]]:
    plan, rendered = render_to(job, "torchrun", out, options={"master_addr": "127.0.0.1", "master_port": free_port()}, **TWO_NODES)
    assert plan.placement.nodes == 2 and plan.placement.procs_per_node == 1 and plan.config.world_size == 2
    argvs = [list(c.argv) for c in rendered.commands]
    with processes() as procs:
        node_logs = [out.parent / f"{out.name}-node{r}.log" for r in range(2)]
        for cmd, log in zip(rendered.commands, node_logs):
            procs.start(cmd.argv, env={**cmd.env, **(fault or {})}, log=log)
        codes = procs.wait_all(timeout=150)
    assert codes == [0, 0], logs(*node_logs)
    return argvs, codes


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, support_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("torchrun")
    job = write_job(root / "job.yaml", TORCH_JOB)
    with pytest.MonkeyPatch.context() as mp:  # module scope: the per-test environment fixture is not active yet
        mp.setenv("PYTHONPATH", child_pythonpath(support_dir))
        mp.setenv("TRAINPLAN_HOME", str(root / "home"))
        argvs, _ = _launch(job, root / "run")
    for rank, argv in enumerate(argvs):
        for arg in ("--nnodes=2", f"--node-rank={rank}", "--rdzv-backend=c10d", "--nproc-per-node=1", "--max-restarts=2"):
            assert arg in argv
        assert any(a.startswith("--rdzv-endpoint=127.0.0.1:") for a in argv)
    return root / "run"


def test_two_nodes_train_one_model(uninterrupted: Path) -> None:
    starts = records(uninterrupted, "start")
    assert [r["rank"] for r in starts] == [0, 1]
    assert len({r["pid"] for r in starts}) == 2 and all(r["world_size"] == 2 for r in starts)
    ends = records(uninterrupted, "end")
    assert len(ends) == 2 and ends[0]["params_sha256"] == ends[1]["params_sha256"]  # identical parameters on both ranks
    assert "DistributedDataParallel" in ends[0]["wrapped_as"]
    assert (uninterrupted / "model.pt").exists()


def test_killed_worker_restarts_and_resumes_from_checkpoint(tmp_path: Path, torch_job: Path, uninterrupted: Path) -> None:
    out = tmp_path / "run"
    _launch(torch_job, out, fault={"TRAINPLAN_FAULT_SIGKILL_AT_STEP": "6", "TRAINPLAN_FAULT_RANK": "1"})
    resumed = events(out, "resume")
    assert resumed and resumed[0]["step"] == 4  # the checkpoint before the kill at step 6
    # the killed node's agent restarted its worker (the other node's agent re-joined the rendezvous without a failure)
    assert max(r["restart_count"] for r in records(out, "start")) >= 1
    ends = records(out, "end")
    assert len(ends) == 2 and ends[0]["params_sha256"] == ends[1]["params_sha256"]
    assert_same_weights(out / "model.pt", uninterrupted / "model.pt")  # as if nothing had happened
