"""What the reference does, per check: one sentence a failing verdict is read against, with
the upstream source it mirrors (torch 2.13, ``torch/nn/parallel/distributed.py`` unless named
otherwise). The failures file prints it under each failing verdict, after the case's own
description (:attr:`conformance.cases.row.Case.description`).
"""
from __future__ import annotations

#: check name -> (what a conforming DDP does, where upstream does it).
CHECK_SEMANTICS = {
    "param_parity": ("after every optimizer step each replica's parameters equal one device's "
                     "trained on the global batch: the DDP all-reduces gradients and divides by "
                     "the world size", "DistributedDataParallel: Reducer allreduce, gradient / world size"),
    "loss_parity": ("the replicas' mean loss equals the single-device loss on the global batch at "
                    "every step (the parameters it is computed from match)", "as param_parity"),
    "buffer_parity": ("with broadcast_buffers=True every training forward starts from rank 0's "
                      "buffers (module states are broadcast at construction only with it); with "
                      "broadcast_buffers=False each replica keeps its own",
                      "DistributedDataParallel.__init__ (_sync_module_states) and forward (_sync_buffers)"),
    "buffers": ("with broadcast_buffers=True a forward that follows a synced, grad-enabled one (or "
                "construction) starts from rank 0's buffers, whatever the module's mode; a forward under "
                "no_grad or no_sync clears that, so the next forward keeps each replica's own",
                "DistributedDataParallel._pre_forward / _post_forward (require_forward_param_sync, _sync_buffers)"),
    "graph_agreement": ("on an XLA runtime every replica builds the same step graph (same ops, shapes and "
                        "inlined constants) at every step: SPMD collectives meet only between identical "
                        "programs, so a rank-dependent Python value in the graph recompiles per replica or "
                        "deadlocks on a real deployment", "torch_xla: one HLO per step (xm.mark_step / "
                        "torch_xla.sync), XLA collectives rendezvous on matching programs"),
    "agreement": ("every replica holds the same parameters bit for bit after construction and "
                  "after every step (one broadcast, then identical reduced gradients)",
                  "DistributedDataParallel.__init__ (_sync_module_states, src=0)"),
    "transparency": ("the DDP leaves what the module, the optimizer, the RNG and the user's code observe as "
                     "they were: the same parameter and buffer objects (broadcasts in place), requires_grad, "
                     "training flags, module hooks, the default generator's state, state_dict keys under "
                     "'module.', the module's output structure",
                     "DistributedDataParallel.__init__ / forward (in-place _sync_module_states, "
                     "_sync_buffers; no random draws; module kept as self.module)"),
    "optimizer_state": ("the optimizer state after the run equals one device's (it only ever saw "
                        "the averaged gradients)", "torch.optim on the reduced .grad"),
    "state_sync": ("construction broadcasts rank 0's parameters and buffers to every replica",
                   "DistributedDataParallel.__init__ -> _sync_module_states"),
    "params": ("each step of the generated run equals the single-device oracle of DDP semantics "
               "(no_sync accumulates locally, the synced backward reduces the sum; unused "
               "parameters keep grad None with find_unused_parameters)",
               "DistributedDataParallel.no_sync, Reducer (find_unused_parameters)"),
    "eval_outputs": ("a forward without backward (validation under no_grad / inference_mode, a target "
                     "forward before a backward) returns on every replica what one device returns on that "
                     "replica's batch, from the buffers the DDP's buffer rule leaves it",
                     "DistributedDataParallel.forward (_pre_forward buffer sync; no reducer work without grad)"),
    "inside": ("inside no_sync() gradients are not reduced: each replica keeps its local sum",
               "DistributedDataParallel.no_sync"),
    "after": ("the first synced backward after no_sync() reduces the accumulated gradients",
              "DistributedDataParallel.no_sync"),
    "grads": ("the reduced gradient is the mean of the replicas' local gradients", "Reducer"),
    "loss_decrease": ("a lossy comm hook still trains: the loss falls by at least half of exact "
                      "DDP's fall", "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook"),
    "property": ("the property of the case description holds on every drawn example",
                 "DistributedDataParallel semantics (docs/properties)"),
    "ranks": ("rank bindings are consistent: global ordinals 0..W-1, process indices 0..P-1",
              "jax.process_index / torch.distributed.get_rank"),
    "result": ("every rank's result equals the op's float64 host oracle (bitwise where exact)",
               "torch.distributed.distributed_c10d op semantics"),
    "coverage": ("every dtype and reduction the backend claims runs", "torch.distributed.ReduceOp"),
}


#: (family, check) -> sentence and source where a family's check means something else.
FAMILY_SEMANTICS = {
    ("collective", "agreement"): ("every rank holds the same bits of the result where the op "
                                  "promises one result (all_reduce, broadcast, all_gather)",
                                  "torch.distributed.distributed_c10d"),
}


def expected_behaviour(case, check: str) -> str:
    """One line: the case's description, then the check's semantics and source ("" for an
    unknown check: a new check must add its sentence, tests/test_semantics.py)."""
    sem = FAMILY_SEMANTICS.get((getattr(case, "family", ""), check)) or CHECK_SEMANTICS.get(check)
    text = case.description if case is not None else ""
    if sem:
        text += f"{'; ' if text else ''}{check}: {sem[0]} (upstream: {sem[1]})"
    return text
