"""Run directory rules, atomic checkpoints, metrics files (no processes started)."""

from __future__ import annotations

import json
import pickle
import random
from fractions import Fraction

import pytest
import torch

from trainplan.errors import TrainplanError
from trainplan.files import write_json_atomic
from trainplan.run.checkpoint import CheckpointStore, load_tensor_file, rng_state, save_tensor_file, set_rng_state
from trainplan.run.metrics import MetricsTail, MetricsWriter, read_metrics, step_figures, truncate_after
from trainplan.run.rundir import prepare_run_dir

JOB = {"kind": "torch", "steps": 3}


def test_empty_or_missing_directories_are_used(tmp_path) -> None:
    assert prepare_run_dir(tmp_path / "new", job=JOB, resume=False, overwrite=False).root.is_dir()
    (tmp_path / "empty").mkdir()
    prepare_run_dir(tmp_path / "empty", job=JOB, resume=False, overwrite=False)


def test_user_files_are_never_clobbered(tmp_path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    with pytest.raises(TrainplanError) as err:
        prepare_run_dir(mine, job=JOB, resume=False, overwrite=False)
    assert err.value.field == "--out" and "--resume" in str(err.value) and "--overwrite" in str(err.value)
    with pytest.raises(TrainplanError) as err:
        prepare_run_dir(mine, job=JOB, resume=False, overwrite=True)
    assert err.value.field == "--overwrite" and "not a trainplan run directory" in str(err.value)
    assert (mine / "thesis.tex").read_text() == "precious"


def test_overwrite_replaces_a_run_directory(tmp_path) -> None:
    run = prepare_run_dir(tmp_path / "r", job=JOB, resume=False, overwrite=False)
    write_json_atomic(run.run_config, {"job": JOB})
    (run.root / "metrics.jsonl").write_text("{}\n")  # what the old run wrote
    prepare_run_dir(tmp_path / "r", job=JOB, resume=False, overwrite=True)
    assert not (run.root / "metrics.jsonl").exists()


def test_resume_rules(tmp_path) -> None:
    with pytest.raises(TrainplanError, match="no trainplan run"):
        prepare_run_dir(tmp_path / "none", job=JOB, resume=True, overwrite=False)
    with pytest.raises(TrainplanError, match="not both"):
        prepare_run_dir(tmp_path / "none", job=JOB, resume=True, overwrite=True)
    run = prepare_run_dir(tmp_path / "r", job=JOB, resume=False, overwrite=False)
    write_json_atomic(run.run_config, {"job": JOB})
    assert prepare_run_dir(run.root, job=JOB, resume=True, overwrite=False) == run
    with pytest.raises(TrainplanError, match="different job"):
        prepare_run_dir(run.root, job={**JOB, "steps": 4}, resume=True, overwrite=False)
    write_json_atomic(run.summary, {"status": "completed"})
    with pytest.raises(TrainplanError, match="already completed"):
        prepare_run_dir(run.root, job=JOB, resume=True, overwrite=False)


def test_checkpoints_commit_atomically_and_prune(tmp_path) -> None:
    store = CheckpointStore(tmp_path, rank=0, barrier=lambda: None, keep=2)
    assert store.latest() is None
    for step in (4, 8, 12):
        folder = store.begin(step)
        save_tensor_file({"w": torch.full((2,), float(step))}, folder / "model.pt")
        store.commit(step, world_size=1, strategy="single")
    ref = store.latest()
    assert ref is not None and ref.step == 12 and ref.strategy == "single"
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_00000008", "step_00000012"]
    # a crash while writing step 16 leaves a .partial that is never read
    folder = store.begin(16)
    (folder / "model.pt").write_bytes(b"torn")
    assert store.latest().step == 12
    assert load_tensor_file(store.latest().path / "model.pt")["w"].tolist() == [12.0, 12.0]


def _three_checkpoints(root) -> CheckpointStore:
    store = CheckpointStore(root, rank=0, barrier=lambda: None, keep=3)
    for step in (4, 8, 12):
        folder = store.begin(step)
        save_tensor_file({"w": torch.full((2,), float(step))}, folder / "model.pt")
        save_tensor_file({"step": step}, folder / "trainer_rank0.pt")
        store.commit(step, world_size=1, strategy="single")
    return store


def _flip_one_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda root: _flip_one_byte(root / "step_00000012" / "model.pt"), "does not match its SHA-256"),
        (lambda root: (root / "step_00000012" / "model.pt").write_bytes(b"torn"), "has 4 bytes"),
        (lambda root: (root / "step_00000012" / "trainer_rank0.pt").unlink(), "trainer_rank0.pt is missing"),
        (lambda root: (root / "step_00000012" / "MANIFEST.json").unlink(), "no manifest"),
        (lambda root: (root / "latest.json").write_text("{not json"), None),  # the folders are still found
        (lambda root: (root / "latest.json").unlink(), None),
    ],
)
def test_resume_skips_damaged_checkpoints_for_the_newest_good_one(tmp_path, damage, reason) -> None:
    store = _three_checkpoints(tmp_path)
    damage(tmp_path)
    ref, skipped = store.newest_good()
    if reason is None:  # a damaged or deleted pointer: step 12 is still found, verified, used
        assert ref is not None and ref.step == 12
    else:
        assert ref is not None and ref.step == 8 and load_tensor_file(ref.path / "model.pt")["w"].tolist() == [8.0, 8.0]
        assert len(skipped) == 1 and skipped[0].startswith("step_00000012: ") and reason in skipped[0]


def test_no_good_checkpoint_means_none_and_every_reason(tmp_path) -> None:
    store = _three_checkpoints(tmp_path)
    for step in (4, 8, 12):
        _flip_one_byte(tmp_path / f"step_{step:08d}" / "model.pt")
    ref, skipped = store.newest_good()
    assert ref is None and [s.split(":")[0] for s in skipped] == ["step_00000012", "step_00000008", "step_00000004"]


def test_weights_only_loading_refuses_arbitrary_objects(tmp_path) -> None:
    torch.save({"x": Fraction(1, 3)}, tmp_path / "evil.pt")  # any non-tensor class would be code to run
    with pytest.raises(pickle.UnpicklingError):
        load_tensor_file(tmp_path / "evil.pt")


def test_rng_state_round_trip(tmp_path) -> None:
    torch.manual_seed(3)
    random.seed(3)
    save_tensor_file(rng_state(), tmp_path / "rng.pt")
    expected = (torch.rand(3), random.random())
    torch.manual_seed(99)
    random.seed(99)
    set_rng_state(load_tensor_file(tmp_path / "rng.pt"))
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_metrics_tail_truncate_and_figures(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path)
    tail = MetricsTail(path)
    writer.event("start")
    for step, t in enumerate([5.0, 1.0, 1.2, 0.8], start=1):
        writer.write({"step": step, "step_time_s": t, "loss": 10.0 / step, **({"warmup": True} if step == 1 else {})})
    writer.close()
    assert len(tail.new_records()) == 5 and tail.new_records() == []
    figs = step_figures(read_metrics(path))
    assert figs.steps == 4 and figs.step_time_s == pytest.approx(1.0) and figs.final_loss == pytest.approx(2.5)
    truncate_after(path, 2)
    assert [r.get("step") for r in read_metrics(path)] == [None, 1, 2]
    assert [r.get("step") for r in tail.new_records()] == [None, 1, 2]  # the tail notices the replaced file
    with open(path, "a") as fh:
        fh.write('{"step": 3')  # a torn last line
    assert [r.get("step") for r in read_metrics(path)] == [None, 1, 2]
    assert tail.new_records() == []


def test_atomic_json_leaves_no_temporary_files(tmp_path) -> None:
    write_json_atomic(tmp_path / "a.json", {"x": 1})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_the_failure_line_is_the_workers_cause_not_torchruns(tmp_path) -> None:
    from trainplan.run.api import last_error_line

    log = tmp_path / "launch.log"
    log.write_text(
        "$ python -m torch.distributed.run ...\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "train.py", line 3, in <module>\n'
        "[rank1]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "E1204 worker 1 failed\n"
        "Traceback (most recent call last):\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
    )
    assert last_error_line(log) == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    log.write_text("Traceback (most recent call last):\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert last_error_line(log).endswith("ChildFailedError:")  # nothing better: the launcher's own line


def test_a_locked_run_directory_is_refused_and_freed_when_its_holder_exits(tmp_path) -> None:
    import subprocess
    import sys

    from trainplan.run.rundir import RunLock

    root = tmp_path / "run"
    root.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from trainplan.run.rundir import RunLock; "
        f"RunLock.acquire(Path({str(root)!r})); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TrainplanError) as err:
            RunLock.check_free(root)
        assert err.value.field == "--out" and f"pid {holder.pid}" in str(err.value)
        with pytest.raises(TrainplanError):
            RunLock.acquire(root)
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock.acquire(root)  # the kernel dropped the dead holder's lock
    lock.release()


def test_overwrite_deletes_only_what_trainplan_wrote(tmp_path) -> None:
    """A folder that merely holds a run.json (a user's project) is not deleted with its other files."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "run.json").write_text("{}")
    (project / "notes.txt").write_text("mine")
    with pytest.raises(TrainplanError) as err:
        prepare_run_dir(project, job=JOB, resume=False, overwrite=True)
    assert err.value.field == "--overwrite" and "notes.txt" in str(err.value)
    assert (project / "notes.txt").read_text() == "mine"
    run = tmp_path / "run"  # a real run directory is replaced
    run.mkdir()
    for name in ("run.json", "metrics.jsonl", "summary.json", ".lock"):
        (run / name).write_text("{}")
    (run / "checkpoints").mkdir()
    assert prepare_run_dir(run, job=JOB, resume=False, overwrite=True).root == run and not any(run.iterdir())
    link = tmp_path / "link"
    link.symlink_to(run)
    with pytest.raises(TrainplanError, match="symbolic link"):
        prepare_run_dir(link, job=JOB, resume=False, overwrite=True)
