"""A DDP that takes its world size from the launcher's environment, written from scratch on
torch.distributed over the outside ``CorrectDDP`` (``loop_buffer_timing.py``).

``EnvWorldSizeDDP``: the divisor of its gradient mean is ``int(os.environ.get("WORLD_SIZE", 1))``,
as scripts written for torchrun read it. Right under torchrun; under ``mp.spawn`` (no launcher
variables) it divides by 1, a sum instead of a mean.
"""
import os

from tests.outside.loop_buffer_timing import CorrectDDP


class EnvWorldSizeDDP(CorrectDDP):
    """The gradient mean's divisor read from ``WORLD_SIZE`` (default 1)."""

    def __init__(self, module, *args, **kwargs):
        super().__init__(module, *args, **kwargs)
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
