"""Faulty sharded DDP (v): the gathered mean is written only into gradients that exist locally.

Fault: the all-gathered bucket is copied back only into the parameters whose gradient hook fired
on this replica (ZeRO-2 tracks the parameters "in the bucket" from the hooks), so a parameter this
replica did not use but another did keeps ``None`` here: this replica does not update it, the
others do. The reduction itself is right (the absent gradient is reduced as zeros).
Modelled on: deepspeedai/DeepSpeed#777 (ZeRO stage 2 drives its buckets from the gradient hooks;
a parameter whose hook never fires on a rank breaks it)
https://github.com/deepspeedai/DeepSpeed/issues/777 .
Exposed by: find_unused_parameters with rank-dependent parameter use; replica agreement.
"""

from .sharded_correct import ShardedCorrectDDP


class ShardedUnusedNotWrittenDDP(ShardedCorrectDDP):
    def _write_grads(self, idx, mean, used):
        off = 0
        for i in idx:
            p = self._params[i]
            n = p.numel()
            if used[i] > 0 and p.grad is not None:  # the fault: local existence, not global use
                g = mean[off:off + n].view_as(p)
                if self.gradient_as_bucket_view:
                    p.grad = g
                else:
                    p.grad.copy_(g)
            off += n
