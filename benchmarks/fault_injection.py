"""Hostile and careless input, damaged files, killed processes, concurrent runs: does trainplan hold? (issue 21)

    python benchmarks/fault_injection.py            # needs the torch extra (and fastapi + httpx for the serve cases)

Each case runs the real CLI (a subprocess, as a user would) or the serve app, and checks what must hold: one line
naming the field and a non-zero exit (no traceback), nothing of the user's lost, a resume that falls back or
finishes, no process left behind. Prints one line per case and the count held.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
MODEL = "import torch\n\ndef mlp():\n    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))\n" \
        "\n\nclass _Slow(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.lin = torch.nn.Linear(8, 4)\n\n" \
        "    def forward(self, x):\n        import time\n        time.sleep(0.05)\n        return self.lin(x)\n\n\ndef slow():\n    return _Slow()\n"
TORCH_JOB = ("kind: torch\nname: {name}\nmodel: fi_models:{model}\ninputs: [{{shape: [8]}}]\nloss: cross_entropy\n"
             "micro_batch: 4\nsteps: {steps}\nprecision: fp32\nseed: 1\n")


class Bench:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(work)]),
                    "TRAINPLAN_HOME": str(work / "home")}  # fmt: skip
        self.results: list[tuple[str, bool, str]] = []

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trainplan.cli.main", *args], env=self.env, cwd=self.work,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip

    def job(self, name: str, text: str) -> Path:
        path = self.work / name
        path.write_text(text)
        return path

    def case(self, title: str, check: Callable[[], str | None]) -> None:
        try:
            problem = check()
        except Exception as exc:  # noqa: BLE001 - a case that crashes the bench did not hold
            problem = f"{type(exc).__name__}: {exc}"
        self.results.append((title, problem is None, problem or ""))
        print(f"{'held  ' if problem is None else 'FAILED'} {title}{'' if problem is None else ': ' + problem}", flush=True)


def one_line_refusal(p: subprocess.CompletedProcess[str], field: str) -> str | None:
    lines = p.stderr.strip().splitlines()
    if p.returncode == 0:
        return "exit 0"
    if "Traceback" in p.stderr:
        return "traceback"
    if len(lines) != 1 or not lines[0].startswith("error: ") or field not in lines[0]:
        return f"expected one line naming {field}, got {p.stderr.strip()[:200]!r}"
    return None


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(Path(tmp))
        (b.work / "fi_models.py").write_text(MODEL)
        ref = str(ROOT / "src" / "trainplan" / "examples" / "llama7b-sft.yaml")

        # ---------------------------------------------------------------- input
        b.case("job name with a newline and a command", lambda: one_line_refusal(
            b.cli("plan", str(b.job("n.yaml", TORCH_JOB.format(name='"x\\ntouch pwned\\n#"', model="mlp", steps=3)))), "name"))
        b.case("job name with rich markup", lambda: one_line_refusal(
            b.cli("plan", str(b.job("m.yaml", TORCH_JOB.format(name='"[/bold]"', model="mlp", steps=3)))), "name"))
        bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
        b.case("YAML billion laughs", lambda: one_line_refusal(b.cli("plan", str(b.job("bomb.yaml", bomb)), timeout=30), ""))
        b.case("YAML nested 20,000 deep", lambda: one_line_refusal(
            b.cli("plan", str(b.job("deep.yaml", "a: " + "[" * 20000 + "]" * 20000 + "\n")), timeout=30), ""))
        fifo = b.work / "fifo.yaml"
        os.mkfifo(fifo)
        b.case("a FIFO as the job file", lambda: one_line_refusal(b.cli("plan", str(fifo), timeout=30), ""))
        b.case("a 400-digit seq_len", lambda: one_line_refusal(b.cli("plan", str(b.job("big.yaml", Path(ref).read_text()
               .replace("seq_len: 512", "seq_len: " + "9" * 400)))), "seq_len"))  # fmt: skip
        b.case("--checkpoint-minutes -1", lambda: one_line_refusal(
            b.cli("run", ref, "--checkpoint-minutes", "-1"), ""))

        # ---------------------------------------------------------------- files the user has
        def overwrite_project() -> str | None:
            project = b.work / "project"
            project.mkdir()
            (project / "run.json").write_text("{}")
            (project / "notes.txt").write_text("mine")
            job = b.job("ow.yaml", TORCH_JOB.format(name="ow", model="mlp", steps=3))
            p = b.cli("run", str(job), "--out", str(project), "--overwrite")
            return one_line_refusal(p, "--overwrite") or (None if (project / "notes.txt").exists() else "notes.txt lost")
        b.case("run --overwrite onto a folder with run.json and the user's files", overwrite_project)

        def report_onto_job() -> str | None:
            job = b.job("keep.yaml", Path(ref).read_text())
            before = job.read_text()
            p = b.cli("report", str(job), "-o", str(job))
            return one_line_refusal(p, "--out") or (None if job.read_text() == before else "job file overwritten")
        b.case("report -o onto the job file", report_onto_job)
        b.case("an unwritable --out (OSError)", lambda: one_line_refusal(
            b.cli("report", ref, "-o", "/proc/self/none/x.html"), "/proc/self/none"))

        # ---------------------------------------------------------------- checkpoints
        def damaged_resume(damage: Callable[[Path], None]) -> Callable[[], str | None]:
            def check() -> str | None:
                job = b.job("ck.yaml", TORCH_JOB.format(name="ck", model="mlp", steps=12))
                out = b.work / f"ck-{time.monotonic_ns()}"
                env_kill = {**b.env, "TRAINPLAN_FAULT_SIGKILL_AT_STEP": "10"}
                subprocess.run([sys.executable, "-m", "trainplan.cli.main", "run", str(job), "--out", str(out),
                                "--checkpoint-every", "4", "--max-restarts", "0"], env=env_kill, cwd=b.work,
                               capture_output=True, text=True, timeout=300)  # fmt: skip
                damage(out / "checkpoints")
                p = b.cli("run", str(job), "--out", str(out), "--resume", "--checkpoint-every", "4", "--json")
                if p.returncode != 0:
                    return f"resume failed: {p.stderr.strip()[-200:]}"
                events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
                resumed = [e["step"] for e in events if e.get("event") == "resume"]
                return None if resumed and resumed[-1] >= 4 else f"resumed from {resumed}"
            return check
        b.case("flipped byte in the newest optim.pt", damaged_resume(lambda c: flip(c / "step_00000008" / "optim.pt")))
        b.case("truncated newest model.pt", damaged_resume(lambda c: (c / "step_00000008" / "model.pt").write_bytes(b"x")))
        b.case("deleted latest.json", damaged_resume(lambda c: (c / "latest.json").unlink()))
        b.case("garbage latest.json", damaged_resume(lambda c: (c / "latest.json").write_text("{oops")))

        # ---------------------------------------------------------------- processes
        def killed_launcher() -> str | None:
            job = b.job("slow.yaml", TORCH_JOB.format(name="slow", model="slow", steps=400))
            out = b.work / "slow"
            proc = subprocess.Popen([sys.executable, "-m", "trainplan.cli.main", "run", str(job), "--out", str(out),
                                     "--strategy", "ddp", "--devices", "2"], env=b.env, cwd=b.work,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and len(list((out / "ranks").glob("*.start.json"))) < 2:
                time.sleep(0.2)
            pids = [json.loads(f.read_text())["pid"] for f in (out / "ranks").glob("*.start.json")]
            second = b.cli("run", str(job), "--out", str(out), "--resume")  # beside a live run: refused
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            deadline = time.monotonic() + 60
            alive = pids
            while alive and time.monotonic() < deadline:
                time.sleep(0.2)
                alive = [p for p in pids if Path(f"/proc/{p}").exists() and
                         Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"]  # fmt: skip
            problem = one_line_refusal(second, "--out")
            return problem or (f"workers {alive} outlived the launcher" if alive else None)
        b.case("a second run on a live run's --out, then the launcher SIGKILLed", killed_launcher)

        # ---------------------------------------------------------------- the page
        try:
            from fastapi.testclient import TestClient

            from trainplan.serve.app import create_app

            local = TestClient(create_app(), base_url="http://localhost:8765")
            b.case("serve: preset /etc/shadow", lambda: None if local.post("/api/estimate", json={"preset": "/etc/shadow"})
                   .status_code == 422 else "accepted")  # fmt: skip
            b.case("serve: DNS-rebound Host", lambda: None if TestClient(create_app(), base_url="http://evil.example")
                   .get("/").status_code == 400 else "answered")  # fmt: skip
            b.case("serve: a 20 MB name", lambda: None if local.post("/api/estimate", json={"name": "x" * 20_000_000})
                   .status_code == 413 else "accepted")  # fmt: skip
        except ImportError:
            print("serve cases skipped: pip install 'trainplan[serve,test]'")

        held = sum(ok for _, ok, _ in b.results)
        print(f"{held}/{len(b.results)} cases held")
        return 0 if held == len(b.results) else 1


if __name__ == "__main__":
    sys.exit(main())
