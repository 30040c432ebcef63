"""Faulty DDP (18.5): a gradient is taken into its bucket at its hook's first firing in a backward.

Fault: each parameter's gradient is copied into the DDP's bucket when its post-accumulate-grad
hook first fires in a synced backward; later firings find it "already ready" and are ignored. The
buckets are all-reduced at the end of backward and written back into the gradients. When a
gradient is accumulated twice in one backward - a module applied twice under reentrant activation
checkpointing (``torch.utils.checkpoint(..., use_reentrant=True)``), whose nested backwards each
run the parameter's AccumulateGrad - the second contribution never reaches the all-reduce and is
overwritten by the reduced value. Upstream DDP raises "Expected to mark a variable ready only
once" there unless ``static_graph=True``, with which it waits for the last firing.
Modelled on: pytorch/pytorch#84589 ("Update DDP checkpoint documentation": a layer checkpointed
several times with use_reentrant=True) https://github.com/pytorch/pytorch/issues/84589 , and the
field report microsoft/FocalNet#4 https://github.com/microsoft/FocalNet/issues/4 .
Exposed by: the graph-shape dimension (parity.checkpoint_reentrant: block.weight / block.bias).
"""

from .correct_ddp import CorrectDDP


class FirstFiringSnapshotDDP(CorrectDDP):
    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)
        self._taken = {}  # id(param) -> the gradient as it was at the hook's first firing

    def _on_grad(self, p):
        super()._on_grad(p)
        if self.require_backward_grad_sync and id(p) not in self._taken:
            self._taken[id(p)] = p.grad.detach().clone()

    def _reduce_bucket(self, b, idx, divisor):
        params = [self._params[i] for i in idx]
        live = [p.grad for p in params]
        for p in params:  # the bucket is packed from what was taken at the first firing
            if id(p) in self._taken:
                p.grad = self._taken[id(p)]
        try:
            return super()._reduce_bucket(b, idx, divisor)
        finally:
            for p, g in zip(params, live):
                p.grad = g

    def _reduce(self):
        try:
            super()._reduce()
        finally:
            self._taken = {}
