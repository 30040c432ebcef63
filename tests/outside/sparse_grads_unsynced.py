"""Faulty DDP: sparse gradients are left out of the reduction.

Fault: the reduction skips parameters whose gradient is sparse (``nn.Embedding(sparse=True)``),
so each replica applies its own local embedding gradient and the replicas drift apart; dense
models are unaffected.
Modelled on: pytorch/pytorch#19443 and #22037 (sparse gradients in DistributedDataParallel:
upstream reduces them as it does dense ones) https://github.com/pytorch/pytorch/issues/22037 .
Exposed by: the sparse-gradient corner (parity.sparse_embedding).
"""

from .correct_ddp import CorrectDDP


class SparseGradsUnsyncedDDP(CorrectDDP):
    def _write_back(self, b, idx, flat, used):
        sparse = {i: self._params[i].grad for i in idx
                  if self._params[i].grad is not None and self._params[i].grad.is_sparse}
        super()._write_back(b, idx, flat, used)
        for i, local in sparse.items():  # the local sparse gradient is put back unreduced
            self._params[i].grad = local
