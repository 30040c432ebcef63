"""Module-axis fault 2b (issue 25 item 6, the half of fault 2 nothing caught): the construction
broadcast sends every buffer, but the broadcast before each training forward sends only
floating-point buffers, so an integer buffer whose value depends on the local data (a count of
the samples a replica saw) drifts apart after the first step.

Written as a regression case of what ``module_axis_int_buffers_skipped`` showed: that DDP was
caught at construction only (``property.broadcast``), and no case then checked integer buffers
that differ between replicas after a training forward. Everything else is
``module_axis_correct.Class``.
"""

from tests.outside.module_axis_correct import Class as _Correct


class Class(_Correct):
    def _synced_buffers(self):
        return [b for b in self.module.buffers() if b.is_floating_point()]  # FAULT
