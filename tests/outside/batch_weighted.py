"""Faulty DDP (p): gradients weighted by local batch size.

Fault: each replica's gradient is weighted by its local batch size / global batch size before
the sum (a sample-weighted mean) instead of DDP's equal average of the replicas' local-mean
gradients. With equal local batches the two are identical; only uneven shards expose it.
Modelled on: pytorch/pytorch#37359 ("Support custom gradient reduction algorithm in DDP":
uneven batch sizes need a weighted mean, DDP does an unweighted one) and pytorch/pytorch#67253
https://github.com/pytorch/pytorch/issues/37359 .
Exposed by: uneven local batch sizes (shards of different lengths); param parity.
"""

import torch
import torch.distributed as dist

from .correct_ddp import CorrectDDP


class BatchWeightedDDP(CorrectDDP):
    def forward(self, *inputs, **kwargs):
        if inputs and torch.is_tensor(inputs[0]) and torch.is_grad_enabled():
            self._local_n = inputs[0].shape[0] if inputs[0].dim() else 1
        out = super().forward(*inputs, **kwargs)
        # inside join() the extra batch-size all-reduce would have no shadow on a joined replica
        # (a gloo abort, not a numeric fault): keep the correct path there
        self._joining = self._join_work is not None
        return out

    def _reduce_bucket(self, b, idx, divisor):
        if getattr(self, "_joining", False):
            return super()._reduce_bucket(b, idx, divisor)
        n = torch.tensor([float(getattr(self, "_local_n", 1))])
        total = n.clone()
        dist.all_reduce(total, group=self.process_group)
        with torch.no_grad():
            for i in idx:  # pre-scale so that the all-reduced sum is the sample-weighted mean
                g = self._params[i].grad
                if g is not None:
                    g.mul_(n.item() * divisor / total.item())
        return super()._reduce_bucket(b, idx, divisor)
