"""Faulty DDP (18.7): a comm hook's future value is ignored; the bucket buffer is read back instead.

Fault: ``register_comm_hook`` is honoured, but after ``hook(state, bucket)`` completes this DDP
writes ``bucket.buffer()`` back into the gradients and drops the future's value - it assumes the
hook reduced the buffer in place, as torch's ``allreduce_hook`` and ``fp16_compress_hook`` do. The
hook contract is that the future's value *is* the reduced bucket
(``DistributedDataParallel.register_comm_hook``); a hook that returns a new tensor leaves every
replica with its own local gradient.
Modelled on: pytorch/pytorch#75031 ("comm hook error in BWD pass": a user's hooks returning
``bucket.buffer()`` on the assumption that it was modified in place)
https://github.com/pytorch/pytorch/issues/75031 ; the return contract: pytorch/pytorch#61640
https://github.com/pytorch/pytorch/pull/61640 .
Exposed by: the comm-hook dimension with a hook that returns a new tensor
(feature.comm_hook_out_of_place).
"""

import torch

from .correct_ddp import CorrectDDP, _Bucket


class CommHookReadsBufferDDP(CorrectDDP):
    def _reduce_bucket(self, b, idx, divisor):
        if self._comm_hook is None:
            return super()._reduce_bucket(b, idx, divisor)
        params = [self._params[i] for i in idx]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params])
        state, hook = self._comm_hook
        bucket = _Bucket(b, flat, params, b == len(self._buckets) - 1)
        hook(state, bucket).wait()  # the value is dropped
        return bucket.buffer()
