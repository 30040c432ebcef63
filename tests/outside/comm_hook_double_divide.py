"""Faulty DDP (b): a comm hook's result divided by the world size a second time.

Fault: with ``register_comm_hook`` the hook (e.g. torch's ``allreduce_hook``) already divides by
the world size, and this DDP divides the hook's result again, so gradients are 1/W too small.
Modelled on: pytorch/pytorch#42399 / #42400 ("DDP communication hook: skip dividing grads by
world_size if hook registered": hooks first received pre-divided gradients)
https://github.com/pytorch/pytorch/pull/42400 .
Exposed by: the comm-hook dimension (parity of a run with ``allreduce_hook`` registered).
"""

from .correct_ddp import CorrectDDP


class CommHookDoubleDivideDDP(CorrectDDP):
    def _reduce_bucket(self, b, idx, divisor):
        out = super()._reduce_bucket(b, idx, divisor)
        return out / self.world_size if self._comm_hook is not None else out
