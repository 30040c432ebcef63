"""Faulty DDP (j): ``join()`` that silently drops the remaining replicas' gradients.

Fault: once a replica has joined (run out of inputs), the replicas still training throw away the
all-reduced gradient of each shadowed iteration and step with zero gradients, so their extra
batches never reach the model. No hang, no error.
Modelled on: pytorch/pytorch#38174 (RFC: join-based API for uneven inputs) and its implementation
pytorch/pytorch#42577 (divisor and shadow all-reduce discussion)
https://github.com/pytorch/pytorch/pull/42577 .
Exposed by: the join / uneven-inputs dimension (param parity after the last even step).
"""

import torch

from .correct_ddp import CorrectDDP


class JoinDropsGradsDDP(CorrectDDP):
    def _reduce(self):
        work = self._join_work
        super()._reduce()
        if work is not None and int(work.result()[0].item()) < self.world_size:
            with torch.no_grad():
                for p in self._params:
                    if p.grad is not None:
                        p.grad.zero_()
