"""Faulty DDP (i): checkpoint reload that breaks the optimizer's link to the parameters.

Fault: ``load_state_dict`` swaps in new parameter tensors (``assign=True``) instead of copying into
the existing ones; the optimizer still holds the old tensors and the DDP's gradient hooks sit
on them too, so after a reload the live model is neither updated nor synchronised. Keys keep the
``module.`` prefix, so the load itself succeeds silently.
Modelled on: hpcaitech/ColossalAI#768 and pytorch/pytorch#53224 (DDP checkpoint prefix handling)
https://github.com/pytorch/pytorch/pull/53224 , and facebookresearch/suncet#36 (optimizer state
that no longer matches the model after reload) https://github.com/facebookresearch/suncet/issues/36 .
Exposed by: the checkpoint dimension (save, reload into the same DDP, keep training with the same
optimizer; param parity after the reload).
"""

from .correct_ddp import CorrectDDP


class CheckpointAssignDDP(CorrectDDP):
    def load_state_dict(self, state_dict, strict=True, assign=False):
        return super().load_state_dict(state_dict, strict=strict, assign=True)
