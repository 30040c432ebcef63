"""Faulty DDP (e): ``gradient_as_bucket_view=True`` leaves gradients stale after the first step.

Fault: once gradients have been bound to the bucket views, later reductions all-reduce the
bucket buffer as it is, assuming autograd wrote the new gradients into the views; after
``zero_grad()`` (set_to_none) autograd allocates fresh gradients, so the optimizer keeps
receiving the first step's (reduced) gradient.
Modelled on: pytorch/xla#8841 (test_ddp_correctness_with_gradient_as_bucket_view fails) and
pytorch/pytorch#41954 / #44344 (grads as bucket views: a grad not aliasing its view must be
copied back in) https://github.com/pytorch/xla/issues/8841 .
Exposed by: the gradient_as_bucket_view dimension (param parity from step 2 with the option on).
"""

from .correct_ddp import CorrectDDP


class BucketViewStaleDDP(CorrectDDP):
    def _reduce_bucket(self, b, idx, divisor):
        if self.gradient_as_bucket_view and self._flat[b] is not None:
            stale = self._flat[b].clone()  # bug: the fresh p.grad is never copied in
            import torch.distributed as dist
            dist.all_reduce(stale, group=self.process_group)
            return stale.div_(divisor)
        return super()._reduce_bucket(b, idx, divisor)
