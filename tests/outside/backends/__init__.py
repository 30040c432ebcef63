"""Backends written from scratch for the collective family's outside-in tests: Python
``torch.distributed.ProcessGroup`` subclasses over a gloo group, one correct, the others with
one fault each. ``register()`` registers one and returns its name (``--backend mod:register``)."""
