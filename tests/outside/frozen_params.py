"""Frozen parameters around a DDP: two faults a user's own DDP makes when part of the model is
frozen, written from scratch on torch.distributed over the outside ``CorrectDDP``
(``loop_buffer_timing.py``, written by a helper from the README alone).

* ``TrainableBroadcastDDP``: the construction broadcast sends only the parameters that require
  grad (the list the DDP reduces): a frozen backbone keeps each replica's own initialisation
  (the fine-tuning recipes load or build it on every rank; only rank 0's is right after wrapping).
* ``FlatGradFrozenDDP``: a contiguous gradient buffer for every parameter, frozen ones included
  (Megatron/apex style): after the reduction a frozen parameter holds a zero gradient instead of
  ``None``, so momentum and weight decay move it and the optimizer keeps state for it.
"""
import torch

from tests.outside.loop_buffer_timing import CorrectDDP


class TrainableBroadcastDDP(CorrectDDP):
    """Construction broadcast of the parameters that require grad only."""

    def __init__(self, module, *args, **kwargs):
        frozen = [p for p in module.parameters() if not p.requires_grad]
        own = [p.detach().clone() for p in frozen]
        super().__init__(module, *args, **kwargs)
        with torch.no_grad():  # what a broadcast over the reduced list leaves on this rank
            for p, o in zip(frozen, own):
                p.copy_(o)


class FlatGradFrozenDDP(CorrectDDP):
    """Every parameter's gradient is a slot of one buffer: a frozen one reads zeros after a step."""

    def _finalize(self):
        super()._finalize()
        for p in self.module.parameters():
            if not p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
