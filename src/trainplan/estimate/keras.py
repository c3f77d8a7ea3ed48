"""Step profiles of Keras 3 models (``kind: keras``), from the model itself and XLA's own analysis.

A child process (``python -m trainplan.estimate.keras JOB_JSON``, TensorFlow
backend, on the CPU) builds the user's model from its factory, compiles it
with the job's optimizer, loss and precision policy, and asks:

* Keras — ``model.count_params()`` and the trainable weights' sizes;
* XLA — the optimized HLO of one jit-compiled ``model.train_step`` and of the
  forward pass (``tf.function(jit_compile=True).experimental_get_compiler_ir``,
  stage ``optimized_hlo``).  FLOPs are counted from its ``dot`` and
  ``convolution`` instructions (2 × output elements × contracted elements,
  the convention of Kaplan et al. 2020, "Scaling Laws", Sec. 2.1: a
  multiply-accumulate is 2 FLOPs), with ``while`` bodies counted
  ``known_trip_count`` times (recurrent layers);
* XLA's buffer assignment of that compile (``--xla_dump_to``, the
  ``*buffer-assignment.txt`` the compiler writes): the preallocated temp
  buffer of the step (activations, gradients and temporaries, with XLA's
  reuse), its parameters (weights, optimizer slots, the batch) and outputs.

Nothing trains and no data is read; the model's weights are allocated on the
host (a model must fit in host RAM to be analysed).  The parent turns the
numbers into a :class:`StepProfile` and the composer plans it like any other
job.  The strategy rules map to ``tf.distribute`` (run side): ``single`` one
replica, ``ddp`` MirroredStrategy on one machine / MultiWorkerMirroredStrategy
across machines, TPUStrategy on TPU — Keras has no ZeRO or FSDP engine, so
only those two are offered.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from trainplan.errors import SpecError
from trainplan.estimate.compute import StepFlops
from trainplan.estimate.profile import Params, ProfileSource, StepMemory, StepProfile
from trainplan.spec import KerasJob, Optimizer, Precision
from trainplan.strategies import Engine

#: What the job's stack runs: one replica, or data parallel (tf.distribute Mirrored / MultiWorkerMirrored / TPUStrategy).
KERAS_ENGINES = (Engine.TORCH,)
KERAS_STACK = "keras (tf.distribute: single, or ddp = MirroredStrategy / MultiWorkerMirroredStrategy / TPUStrategy)"

_CACHE: dict[str, dict[str, Any]] = {}


# ----------------------------------------------------------------------------- HLO text analysis (pure)

_TYPE = r"(?:f8e4m3fn|f8e5m2|f16|bf16|f32|f64|s4|s8|s16|s32|s64|u8|u16|u32|u64|pred|c64|c128)"
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*" + _TYPE + r"\[([\d,]*)\]\S*\s+([a-z\-]+)\((.*)$")
_HEADER_PARAM = re.compile(r"%?([\w.\-]+):\s*" + _TYPE + r"\[([\d,]*)\]")
_COMP = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s+\((.*)\)\s*->.*\{\s*$")


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def _prod(xs: list[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _operands(args: str) -> list[str]:
    """Operand names of an instruction's argument list (up to the closing parenthesis)."""
    depth, cut = 1, len(args)
    for i, ch in enumerate(args):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            cut = i
            break
    return [a.strip().split()[-1].lstrip("%") for a in args[:cut].split(",") if a.strip()]


def _dot_flops(out: list[int], lhs: list[int], attrs: str) -> float:
    """2 × output elements × contracted elements (a multiply-accumulate is 2 FLOPs)."""
    m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs)
    contracted = _prod([lhs[i] for i in _dims(m.group(1)) if i < len(lhs)]) if m else 1
    return 2.0 * _prod(out) * contracted


def _conv_flops(out: list[int], kernel: list[int], attrs: str) -> float:
    """2 × output elements × (kernel elements / output features): per output element, kernel spatial ×
    input features of its group."""
    m = re.search(r"dim_labels=\w+_(\w+)->\w+", attrs)
    out_features = kernel[m.group(1).index("o")] if m and "o" in m.group(1) and len(kernel) == len(m.group(1)) else 1
    return 2.0 * _prod(out) * _prod(kernel) / max(1, out_features)


def hlo_matmul_flops(hlo: str) -> float:
    """FLOPs of the ``dot`` and ``convolution`` instructions of an HLO module (text), each computation counted
    as often as it runs: fusions and calls once per call, ``while`` bodies ``known_trip_count`` times."""
    comps: dict[str, list[tuple[str, list[int], str, str]]] = {}
    shapes: dict[str, dict[str, list[int]]] = {}
    entry = None
    current: str | None = None
    for line in hlo.splitlines():
        m = _COMP.match(line)
        if m:
            current = m.group(2)
            comps[current], shapes[current] = [], {n: _dims(d) for n, d in _HEADER_PARAM.findall(m.group(3))}
            if m.group(1):
                entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        if current is None:
            continue
        im = _INSTR.match(line)
        if im:
            name, dims, op, rest = im.group(1), _dims(im.group(2)), im.group(3), im.group(4)
            shapes[current][name] = dims
            comps[current].append((op, dims, rest, name))
        else:  # tuple-shaped instructions (while, fusions with several outputs): keep the op and its attributes
            tm = re.match(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\(.*?\)\S*\s+([a-z\-]+)\((.*)$", line)
            if tm:
                comps[current].append((tm.group(2), [], tm.group(3), tm.group(1)))
    if entry is None:
        return 0.0
    memo: dict[str, float] = {}

    def while_trips(rest: str) -> int:
        """XLA's ``known_trip_count``, else the bound of the condition's ``compare(i, constant), direction=LT``
        (a counted loop from 0: what tf.while_loop over a sequence lowers to)."""
        t = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', rest)
        if t:
            return int(t.group(1))
        cond = re.search(r"condition=%?([\w.\-]+)", rest)
        todo, lines = [cond.group(1)] if cond else [], []
        while todo and len(lines) < 10_000:  # the condition and the fusions it calls
            body = comps.get(todo.pop(), [])
            lines += body
            todo += [c for _, _, r, _ in body for c in re.findall(r"\bcalls=%?([\w.\-]+)", r)]
        consts = {n: r for o, d, r, n in lines if o == "constant" and not d}
        for o, _, r, _ in lines:
            if o == "compare" and "direction=LT" in r:
                for operand in _operands(r):
                    if operand in consts:
                        return max(1, int(float(consts[operand].split(")")[0])))
        return 0

    def init_bound(comp: str, operands: list[str], known: set[int]) -> int:
        """A loop whose bound is carried in its state (a gradient loop): the scalar constant > 1 in its init
        tuple, else — a backward loop runs as often as its forward loop — the module's one known trip count."""
        instrs = {n: (o, d, r) for o, d, r, n in comps[comp]}
        init = instrs.get(operands[0]) if operands else None
        if init and init[0] == "tuple":
            bounds = {int(float(instrs[o][2].split(")")[0])) for o in _operands(init[2])
                      if o in instrs and instrs[o][0] == "constant" and not instrs[o][1]}  # fmt: skip
            bounds = {b for b in bounds if b > 1}
            if len(bounds) == 1:
                return bounds.pop()
        return next(iter(known)) if len(known) == 1 else 1

    known_trips = {t for c in comps.values() for o, _, r, _ in c if o == "while" for t in [while_trips(r)] if t > 1}

    def cost(name: str, depth: int = 0) -> float:
        if name in memo:
            return memo[name]
        if depth > 64 or name not in comps:
            return 0.0
        total = 0.0
        table = shapes[name]
        for op, dims, rest, _ in comps[name]:
            operands = _operands(rest)
            if op == "dot" and operands and operands[0] in table:
                total += _dot_flops(dims, table[operands[0]], rest)
            elif op == "convolution" and len(operands) > 1 and operands[1] in table:
                total += _conv_flops(dims, table[operands[1]], rest)
            elif op == "while":
                body = re.search(r"body=%?([\w.\-]+)", rest)
                if body:
                    trips = while_trips(rest) or init_bound(name, operands, known_trips)
                    total += trips * cost(body.group(1), depth + 1)
            else:
                for callee in re.findall(r"\bcalls=%?([\w.\-]+)", rest):
                    total += cost(callee, depth + 1)
                bc = re.search(r"branch_computations=\{([^}]*)\}", rest)
                if bc:
                    branches = [b.strip().lstrip("%") for b in bc.group(1).split(",") if b.strip()]
                    total += max((cost(b, depth + 1) for b in branches), default=0.0)
        memo[name] = total
        return total

    return cost(entry)


_ALLOC = re.compile(r"^allocation (\d+): size (\d+), (.*)$")


def buffer_assignment_bytes(text: str) -> dict[str, int]:
    """Bytes of an XLA buffer assignment by kind: ``temp`` (the preallocated temp buffer: activations,
    gradients, temporaries), ``state`` (parameters that are also outputs: weights, optimizer slots),
    ``inputs`` (other parameters: the batch), ``other`` (outputs, constants, thread-local)."""
    out = {"temp": 0, "state": 0, "inputs": 0, "other": 0}
    for line in text.splitlines():
        m = _ALLOC.match(line.strip())
        if not m:
            continue
        size, what = int(m.group(2)), m.group(3)
        if "preallocated-temp" in what:
            out["temp"] += size
        elif what.startswith("parameter") and "maybe-live-out" in what:
            out["state"] += size
        elif what.startswith("parameter"):
            out["inputs"] += size
        else:
            out["other"] += size
    out["total"] = sum(out.values())
    return out


# ----------------------------------------------------------------------------- the profile (pure)


def _grad_bytes_per_param(precision: Precision) -> int:
    """Keras keeps variables (and so their gradients) in float32 under a mixed policy, bfloat16 under bf16-pure."""
    return 2 if precision is Precision.BF16_PURE else 4


def profile_from_analysis(job: KerasJob, a: dict[str, Any]) -> StepProfile:
    """The child's numbers as a :class:`StepProfile` (plain single-replica conventions, like a trace).

    XLA's temp buffer holds the gradients as well as the activations; the composer counts gradients from the
    parameter count (``memory.py``), so they are taken out of it here.
    """
    trainable = int(a["trainable_params"])
    xla = a["xla"]
    grads = trainable * _grad_bytes_per_param(job.precision)
    activations = max(0.0, float(xla["temp"]) - grads) + float(xla["inputs"])
    fwd = float(a["flops_forward"])
    bwd = max(0.0, float(a["flops_step"]) - fwd)
    single_peak = float(xla["total"])
    summary = {
        "framework": "keras",
        "params": int(a["params"]),
        "trainable_params": trainable,
        "frozen_params": int(a["params"]) - trainable,
        "keras_count_params": int(a["count_params"]),
        "flops_forward": fwd,
        "flops_backward": bwd,
        "flops_recompute": 0.0,
        "single_device_peak_gib": single_peak / 2**30,
        "peak_phase": "step",
        "xla_buffer_bytes": dict(xla),
        "at_peak_gib": {
            "state (weights + optimizer)": xla["state"] / 2**30,
            "temp (activations + gradients)": xla["temp"] / 2**30,
            "batch": xla["inputs"] / 2**30,
            "other": xla["other"] / 2**30,
        },
        "notes": list(a.get("notes", ())),
    }
    return StepProfile(
        source=ProfileSource.TRACE,
        params=Params(total=int(a["params"]), trainable=trainable, frozen_bytes=float(a.get("frozen_bytes", 0.0)),
                      largest_block=int(a.get("largest_layer_params", 0)), largest_tensor=int(a.get("largest_weight", 0))),  # fmt: skip
        flops=StepFlops(forward=fwd, backward=bwd, recompute=0.0),
        memory=StepMemory(activations=activations),
        items_per_sample=1,
        throughput_unit="samples_per_s",
        mfu_width=None,
        notes=(f"keras/XLA: single-replica step {single_peak / 2**30:.3f} GiB (XLA buffer assignment), "
               f"{fwd + bwd:.3e} FLOPs per micro-batch",),  # fmt: skip
        engines=KERAS_ENGINES,
        stack=KERAS_STACK,
        trace=summary,
    )


def tensorflow_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorflow") is not None and importlib.util.find_spec("keras") is not None


def analyse_keras_jobs(jobs: list[KerasJob], *, timeout_s: float = 900.0) -> list[dict[str, Any]]:
    """Run the analysis child for ``jobs`` (one process for all that are not cached); raises SpecError with one
    clear line for the first that fails."""
    keys = [json.dumps(j.model_dump(mode="json"), sort_keys=True) for j in jobs]
    todo = [k for k in dict.fromkeys(keys) if k not in _CACHE]
    if todo:
        if not tensorflow_available():
            raise SpecError("kind: keras needs TensorFlow and Keras 3: pip install 'trainplan[tensorflow]'", field="kind")
        with tempfile.TemporaryDirectory(prefix="trainplan-xla-") as dump:
            env = dict(os.environ)
            env.update(
                KERAS_BACKEND="tensorflow",
                TF_CPP_MIN_LOG_LEVEL="3",
                CUDA_VISIBLE_DEVICES="",  # XLA's CPU compile: the analysis is hardware-free
                XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text",
                PYTHONPATH=os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")]),
            )
            payload = "[" + ",".join(todo) + "]"
            try:
                proc = subprocess.run([sys.executable, "-m", "trainplan.estimate.keras", payload, dump], env=env,
                                      capture_output=True, text=True, timeout=timeout_s, check=False)  # fmt: skip
            except subprocess.TimeoutExpired:
                raise SpecError(f"analysing the Keras model took longer than {timeout_s:.0f} s", field="model") from None
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
        if not lines:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise SpecError(f"analysing the Keras model failed: {tail[:300]}", field="model")
        for key, out in zip(todo, json.loads(lines[-1])):
            if "error" in out:
                raise SpecError(out["error"], field=out.get("field", "model"))
            _CACHE[key] = out
    return [_CACHE[k] for k in keys]


def analyse_keras_job(job: KerasJob, *, timeout_s: float = 900.0) -> dict[str, Any]:
    """The analysis of one job (cached per job)."""
    return analyse_keras_jobs([job], timeout_s=timeout_s)[0]


def keras_profile(job: KerasJob) -> StepProfile:
    """The job's step profile from its Keras model (see the module docstring)."""
    return profile_from_analysis(job, analyse_keras_job(job))


# ----------------------------------------------------------------------------- the child (imports TensorFlow)


def _policy(precision: Precision) -> str:
    return {Precision.FP32: "float32", Precision.BF16: "mixed_bfloat16", Precision.FP16: "mixed_float16",
            Precision.BF16_PURE: "bfloat16"}[precision]  # fmt: skip


def keras_optimizer(kind: Optimizer, lr: float, grad_accum: int = 1) -> Any:
    """The job's optimizer as Keras builds it (the run uses the same); ``grad_accum`` > 1 accumulates gradients
    over that many ``train_on_batch`` calls (Keras' ``gradient_accumulation_steps``)."""
    import keras

    extra = {"gradient_accumulation_steps": grad_accum} if grad_accum > 1 else {}
    if kind is Optimizer.SGD:
        return keras.optimizers.SGD(learning_rate=lr, momentum=0.9, **extra)
    if kind is Optimizer.ADAFACTOR:
        return keras.optimizers.Adafactor(learning_rate=lr, **extra)
    if kind is Optimizer.LION:
        return keras.optimizers.Lion(learning_rate=lr, **extra)
    return keras.optimizers.AdamW(learning_rate=lr, **extra)


def keras_loss(name: str) -> Any:
    if ":" in name:
        import importlib

        mod_name, _, fn_name = name.partition(":")
        try:
            return getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as exc:
            raise SpecError(f"cannot import {name}: {exc}", field="loss") from None
    return name


def synthetic_batch(job: KerasJob, rows: int, seed: int, output_shape: tuple[int, ...] | None = None) -> tuple[Any, Any]:
    """Inputs ``[rows, *shape]`` per ``job.inputs`` and a target for the loss, drawn from ``seed`` (numpy)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    xs = []
    for spec in job.inputs:
        shape = (rows, *spec.shape)
        if spec.dtype.startswith(("float", "bfloat")):
            xs.append(rng.standard_normal(shape, dtype=np.float32))
        elif spec.dtype == "bool":
            xs.append(rng.integers(0, 2, shape).astype(bool))
        else:
            xs.append(rng.integers(0, spec.high or 2, shape).astype(np.int32 if spec.dtype == "int32" else np.int64))
    x = xs[0] if len(xs) == 1 else xs
    if output_shape is None:
        return x, None
    out = (rows, *output_shape[1:])
    if job.loss == "sparse_categorical_crossentropy":
        y = rng.integers(0, out[-1], out[:-1]).astype(np.int32)
    elif job.loss == "categorical_crossentropy":
        y = np.eye(out[-1], dtype=np.float32)[rng.integers(0, out[-1], out[:-1])]
    elif job.loss == "binary_crossentropy":
        y = rng.integers(0, 2, out).astype(np.float32)
    else:
        y = rng.standard_normal(out, dtype=np.float32)
    return x, y


def build_model(job: KerasJob, *, jit_compile: bool = True, grad_accum: int = 1) -> Any:
    """The user's model from its factory, compiled with the job's optimizer, loss and precision policy."""
    import importlib

    import keras

    keras.mixed_precision.set_global_policy(_policy(job.precision))
    mod_name, _, fn_name = job.model.partition(":")
    try:
        factory = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"cannot import {job.model}: {exc}", field="model") from None
    keras.utils.set_random_seed(job.seed)
    model = factory(**job.model_args)
    if not isinstance(model, keras.Model):
        raise SpecError(f"{job.model} returned {type(model).__name__}, not a keras.Model", field="model")
    model.compile(optimizer=keras_optimizer(job.optimizer, job.learning_rate, grad_accum), loss=keras_loss(job.loss),
                  jit_compile=jit_compile)  # fmt: skip
    return model


def _analyse(job: KerasJob, dump: Path) -> dict[str, Any]:
    import numpy as np
    import tensorflow as tf

    model = build_model(job)
    x, _ = synthetic_batch(job, job.micro_batch, job.seed)
    y_pred = model(x, training=False)
    out_shape = tuple(int(d) for d in (y_pred[0] if isinstance(y_pred, (list, tuple)) else y_pred).shape)
    x, y = synthetic_batch(job, job.micro_batch, job.seed, out_shape)
    xs = [tf.constant(v) for v in (x if isinstance(x, list) else [x])]
    yt = tf.constant(y)
    model.optimizer.build(model.trainable_variables)

    def fwd(*inputs: Any) -> Any:
        return model(list(inputs) if len(inputs) > 1 else inputs[0], training=True)

    def step(target: Any, *inputs: Any) -> Any:
        return model.train_step((list(inputs) if len(inputs) > 1 else inputs[0], target))

    fwd_hlo = tf.function(fwd, jit_compile=True).experimental_get_compiler_ir(*xs)(stage="optimized_hlo")
    before = set(dump.glob("*buffer-assignment.txt"))
    step_hlo = tf.function(step, jit_compile=True).experimental_get_compiler_ir(yt, *xs)(stage="optimized_hlo")
    reports = sorted(set(dump.glob("*buffer-assignment.txt")) - before) or sorted(dump.glob("*buffer-assignment.txt"))
    if not reports:
        raise SpecError("XLA wrote no buffer assignment (is XLA_FLAGS overridden?)", field="model")
    xla = max((buffer_assignment_bytes(r.read_text()) for r in reports), key=lambda b: b["total"])
    trainable = int(sum(int(np.prod(v.shape)) for v in model.trainable_weights))
    total = int(sum(int(np.prod(v.shape)) for v in model.weights))
    frozen_bytes = float(sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.non_trainable_weights))
    layers = [sum(int(np.prod(w.shape)) for w in layer.weights) for layer in model._flatten_layers(include_self=False)]
    return {
        "params": total,
        "trainable_params": trainable,
        "count_params": int(model.count_params()),
        "frozen_bytes": frozen_bytes,
        "largest_layer_params": max([n for n in layers if n <= total // 2] or [total]),
        "largest_weight": max((int(np.prod(v.shape)) for v in model.trainable_weights), default=0),
        "flops_forward": hlo_matmul_flops(fwd_hlo),
        "flops_step": hlo_matmul_flops(step_hlo),
        "xla": xla,
        "notes": [f"keras {__import__('keras').__version__}, tensorflow {tf.__version__}, policy {_policy(job.precision)}"],
    }


def main(argv: list[str]) -> int:
    from trainplan.errors import TrainplanError

    results = []
    for data in json.loads(argv[0]):
        try:
            job = KerasJob.model_validate(data)
            out = _analyse(job, Path(argv[1]))
        except TrainplanError as exc:
            out = {"error": Exception.__str__(exc).replace("\n", " "), "field": exc.field or "model"}
        except Exception as exc:  # the user's factory, its inputs or XLA failed: one line naming it
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            out = {"error": f"building or compiling {data.get('model')} failed: {type(exc).__name__}: {first}", "field": "model"}
        results.append(out)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
