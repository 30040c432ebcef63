"""The ``scenario`` kind's declaration: the generated and explicit scenarios of the kit's own
model (:mod:`conformance.cases.scenario.scenario`) and, with ``--model``, the loop programs on
the user's model (:mod:`conformance.cases.scenario.userloop`, rows with ``args["user_loop"]``),
one evaluator above both.
"""
from __future__ import annotations

from conformance.cases.kinds import Kind
from conformance.cases.scenario.scenario import _scenario_problem, evaluate_scenario, space_requires
from conformance.cases.scenario.userloop import evaluate_user_loop


def evaluate(case, impl, runtime, w, session, overrides):
    """Verdicts of a ``scenario`` row (:class:`conformance.cases.kinds.Kind` ``evaluate``)."""
    if case.args.get("user_loop"):  # --model: the loop programs on the user's model
        return evaluate_user_loop(case, impl, runtime, w, session, overrides)
    return evaluate_scenario(case, impl, runtime, w, session, overrides)


KIND = Kind("scenario", evaluate, validate=_scenario_problem,
            requires=lambda case: space_requires(case.args.get("space", {})), searches=True)
