"""Two DDPs that refuse one keyword value (docs/keyword-protocol.md), otherwise ``CorrectDDP``.

``RefusesUnbroadcastBuffers`` refuses ``broadcast_buffers=False`` with a ``TypeError`` naming the
keyword (the protocol): the cases passing ``False`` are unsupported, those passing ``True`` run.
``RefusesWithoutNaming`` raises a ``TypeError`` for the same value without naming the keyword:
that is a constructor crash, not a refusal, and the case fails.
"""
from tests.outside.correct_ddp import CorrectDDP


class RefusesUnbroadcastBuffers(CorrectDDP):
    def __init__(self, module, broadcast_buffers=True, **kwargs):
        if broadcast_buffers is False:
            raise TypeError("RefusesUnbroadcastBuffers: broadcast_buffers=False is not implemented")
        super().__init__(module, broadcast_buffers=broadcast_buffers, **kwargs)


class RefusesWithoutNaming(CorrectDDP):
    def __init__(self, module, broadcast_buffers=True, **kwargs):
        if broadcast_buffers is False:
            raise TypeError("RefusesWithoutNaming: this option is not implemented")
        super().__init__(module, broadcast_buffers=broadcast_buffers, **kwargs)
