"""What a training script needs from ``trainplan run``: device, rank, wrapping.

User scripts import it as :mod:`trainplan.runtime` (the same names).  A script
launched with ``trainplan run --script train.py JOB.yaml`` (or run bare with
``python train.py``) does::

    import trainplan.runtime

    ctx = trainplan.runtime.init()                 # device, rank, world size
    model = build_model()
    model, opt = ctx.wrap(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    start = ctx.resume()                           # 0, or the step of the last checkpoint
    for step in range(start, ctx.total_steps or 100):
        for micro in range(ctx.grad_accum):
            x, y = next_batch(step, micro, ctx.rank)
            with ctx.autocast():
                loss = loss_fn(model(x.to(ctx.device)), y.to(ctx.device))
            ctx.backward(loss)
            ctx.step()                             # steps the optimizer at the accumulation boundary
        if ctx.end_of_step(step + 1, loss=loss.item(), samples=ctx.global_batch):
            break                                  # SIGTERM: a checkpoint was written
    ctx.finish()

:meth:`Context.wrap` applies the plan's strategy — nothing (single),
``DistributedDataParallel``, FSDP2 ``fully_shard`` over a device mesh, or
``deepspeed.initialize`` with the generated ZeRO config — and returns a model
and an optimizer to use as usual, except that ``ctx.backward`` / ``ctx.step``
must be used (DeepSpeed's engine owns backward and step, and the context
handles gradient accumulation and gradient synchronisation).

:meth:`Context.end_of_step` is collective: every rank calls it after every
optimizer step.  It averages the loss over ranks, appends a metrics line,
writes checkpoints when due, and reports whether the run must stop because
the process got SIGTERM (then it has already written a checkpoint).

The parts, one module each:

* :mod:`.process` — rank and world size from the launcher, the device, the process group;
* :mod:`.wrapping` — the strategy applied to model and optimizer, one function per engine;
* :mod:`.stepping` — autocast, backward with gradient accumulation, the optimizer step;
* :mod:`.state` — checkpoint, resume, full weights and their fingerprint;
* :mod:`.telemetry` — clocks, checkpoint schedule, metric lines, the result, fault injection;
* :mod:`.context` — :class:`Context`, the facade a script holds, and :func:`init`.

Importing this package imports torch.
"""

from trainplan.run.runtime.context import Context, init
from trainplan.run.runtime.telemetry import FAULT_RANK_ENV, FAULT_STEP_ENV

__all__ = ["FAULT_RANK_ENV", "FAULT_STEP_ENV", "Context", "init"]
