"""Faulty DDP (c): a tied (shared) parameter reduced once per occurrence.

Fault: the parameter list is built without de-duplication, so a weight shared by two submodules
sits twice in the bucket; both slices are all-reduced and both are added into its gradient,
which ends up 2x the replica mean. Models without shared weights are unaffected.
Modelled on: pytorch/pytorch#51929 ("Deduplicate shared params before constructing Reducer in
DDP": shared params got several hooks and wrong numerics) https://github.com/pytorch/pytorch/pull/51929 .
Exposed by: the tied-weights dimension (parity of a model whose two layers share a weight).
"""

import torch

from .correct_ddp import CorrectDDP


class TiedWeightsTwiceDDP(CorrectDDP):
    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)
        self._occurrences = [p for _, p in module.named_parameters(remove_duplicate=False)
                             if p.requires_grad]

    def _write_back(self, b, idx, flat, used):
        super()._write_back(b, idx, flat, used)
        seen = set()
        with torch.no_grad():
            for p in self._occurrences:  # every extra occurrence adds the mean once more
                if id(p) in seen and p.grad is not None and used[self._index[id(p)]] > 0:
                    p.grad.add_(flat[self._offset(idx, p)].view_as(p))
                seen.add(id(p))

    def _offset(self, idx, p):
        off = 0
        for i in idx:
            if self._params[i] is p:
                return slice(off, off + p.numel())
            off += self._params[i].numel()
        return slice(0, 0)
