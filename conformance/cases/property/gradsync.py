"""Property checks of gradient sync: strategies, World tasks and oracles.

The Hypothesis tests in ``conformance/cases/property/kind.py`` draw examples
in the test process with the strategies here, ship them to every replica of a
session's persistent :class:`~conformance.worlds.spawned.World` with
``world.run(<task>, impl=..., **payload)`` and judge the replicas' answers with
the oracles here. The world is reused for every example, never respawned.

They live in sibling modules, along the seams of the property - numbers
(:mod:`~conformance.cases.shared.numerics`), models and their readback
(:mod:`~conformance.cases.property.models`) and three kinds of functions - and
are re-exported here:

* **strategies** (test process, :mod:`~conformance.cases.property.strategies`):
  ``allreduce_examples``, ``mlp_examples``, ``bn_examples``, ...; every example
  records the world size it is for;
* **tasks** (replicas, :mod:`~conformance.cases.property.tasks`):
  ``fn(ctx, *, impl, **payload)``; they build a model, wrap it with
  ``conformance.impls.builtin.resolve_impl(impl).wrap(module, ctx, {})``,
  train nothing (one or a few backward passes) and return numpy;
* **oracles** (test process, :mod:`~conformance.cases.property.oracles`):
  ``check_*`` raise ``AssertionError`` whose message names the world size, the
  element or parameter that broke and the tensors involved;
  ``full_batch_grads`` and friends compute single-device float32 references.

Every tolerance the gradient properties use is in :data:`GRAD_TOLERANCES`; the
all-reduce bound is :func:`allreduce_bound` (derivation in its docstring).
"""
from __future__ import annotations

from conformance.cases.shared.numerics import (ALLREDUCE_DTYPES, DEFAULT_ALLREDUCE_DTYPES,
                                                   FLOAT64_UNIT_ROUNDOFF, GRAD_TOLERANCES, MAX_ELEMENTS,
                                                   MAX_MAGNITUDE, SMALLEST_NORMAL, UNIT_ROUNDOFF,
                                                   GradTolerance, allreduce_bound, gamma, grad_bound)
from conformance.cases.property.models import (build_bn_net, build_mlp, grads_of, host_copy,
                                                 one_param_module, state_of, torch_dtype)
from conformance.cases.property.strategies import (BACKGROUNDS, FEW_BN_WIDTHS, FEW_LOCAL_BATCHES,
                                                     FEW_MLP_WIDTHS, AllReduceExample, BnExample, MlpExample,
                                                     allreduce_examples, bn_examples, mlp_examples,
                                                     nontrivial_permutations, scales, shapes)
from conformance.cases.property.tasks import (allreduce_mean_task, broadcast_task, mlp_grad_task,
                                                no_sync_task, scaled_grad_task)
from conformance.cases.property.oracles import (Measure, accumulated_grads, check_allreduce_mean,
                                                  compare_grads, full_batch_grads, state_difference,
                                                  state_mismatch)

__all__ = [
    "ALLREDUCE_DTYPES", "DEFAULT_ALLREDUCE_DTYPES", "FLOAT64_UNIT_ROUNDOFF", "GRAD_TOLERANCES",
    "MAX_ELEMENTS", "MAX_MAGNITUDE", "SMALLEST_NORMAL", "UNIT_ROUNDOFF", "GradTolerance",
    "allreduce_bound", "gamma", "grad_bound", "build_bn_net", "build_mlp", "grads_of", "host_copy",
    "one_param_module", "state_of", "torch_dtype", "BACKGROUNDS", "FEW_BN_WIDTHS",
    "FEW_LOCAL_BATCHES", "FEW_MLP_WIDTHS", "AllReduceExample", "BnExample", "MlpExample",
    "allreduce_examples", "bn_examples", "mlp_examples", "nontrivial_permutations", "scales",
    "shapes", "allreduce_mean_task", "broadcast_task", "mlp_grad_task", "no_sync_task",
    "scaled_grad_task", "Measure", "accumulated_grads", "check_allreduce_mean", "compare_grads",
    "full_batch_grads", "state_difference", "state_mismatch",
]
