"""The training-script API of ``trainplan run``: ``import trainplan.runtime``.

A stable name for user scripts; the code lives in :mod:`trainplan.run.runtime`
(see its docstring for the loop a script writes)::

    import trainplan.runtime

    ctx = trainplan.runtime.init()
    model, opt = ctx.wrap(model, optimizer)
    ...
    ctx.finish()
"""

from trainplan.run.runtime import FAULT_RANK_ENV, FAULT_STEP_ENV, Context, init

__all__ = ["FAULT_RANK_ENV", "FAULT_STEP_ENV", "Context", "init"]
