"""The ``scenario`` kind: generated training scenarios on the kit's own model and, with
``--model``, the loop programs on the user's model (:mod:`.userloop`, rows with
``args["user_loop"]``) and on models drawn from the zoo (:mod:`.zoo`, ``args["zoo"]``); one
evaluator above them.

A **scenario** is JSON-serialisable data (:class:`.format.Scenario`): a sequence of optimizer
steps, each an accumulation window of ``k`` micro-steps (the first ``k - 1`` under ``no_sync()``,
the last synced), and for every micro-step and replica a local batch size (uneven allowed) and a
*plan*: which branches of the scenario model the replica uses and in which order (rank-dependent
control flow, so gradient hooks fire in rank-dependent orders and parameters go unused on some
replicas). Around it: DDP keywords, buffer rebinding in forward, a loss scale (gradients up to
where fp16 communication overflows; unscaled before the step, as ``GradScaler`` does), the
optimizer, a checkpoint save/reload of DDP + optimizer state mid-run, and the length.

The oracle (:mod:`.oracle`, whose docstring states the semantics and the torch code they mirror)
computes **DDP's semantics** on one device for any scenario: every replica's accumulated gradient
over the window, then the equal average over replicas (not the global-batch gradient: with uneven
local batches the two differ), and the buffers each replica must hold.

The plain scenario model's buffers do not feed its output (an exponential moving
average of the stem activations and a forward counter), so buffer semantics are
judged by the buffer check and cannot mask a gradient fault (the module axis's
``buffer_use`` ``centre`` makes ``ema`` feed it).
"""
from __future__ import annotations

from conformance.cases.kinds import Kind
from conformance.cases.scenario.generate import space_requires
from conformance.cases.scenario.run import evaluate_scenario, scenario_problem
from conformance.cases.scenario.userloop import evaluate_user_loop
from conformance.cases.scenario.zoo import evaluate_zoo


def evaluate(case, impl, runtime, w, session, overrides):
    """Verdicts of a ``scenario`` row (:class:`conformance.cases.kinds.Kind` ``evaluate``)."""
    if case.args.get("user_loop"):  # --model: the loop programs on the user's model
        return evaluate_user_loop(case, impl, runtime, w, session, overrides)
    if case.args.get("zoo"):  # the loop programs on models drawn from the zoo
        return evaluate_zoo(case, impl, runtime, w, session, overrides)
    verdicts = evaluate_scenario(case, impl, runtime, w, session, overrides)
    # a check the case never exercises (a loop program's, where none is drawn) is not reported
    return None if verdicts is None else [v for v in verdicts if v.check in case.checks]


KIND = Kind("scenario", evaluate, validate=scenario_problem,
            requires=lambda case: space_requires(case.args.get("space", {})), searches=True)
