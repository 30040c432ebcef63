"""Bucket caps drawn at their boundaries relative to the model's parameters, not at fixed values.

A DDP buckets gradients in reverse parameter order (torch's ``Reducer``: a bucket is closed once
its bytes reach ``bucket_cap_mb``); faults hide at the boundaries, where a bucket is exactly full,
where every parameter is its own bucket, where one bucket holds the whole model. Each class below
turns the scenario model's gradient sizes into one cap, in MiB (``bytes / 2**20`` is exact in
binary floating point, so the DDP's ``int(cap * 2**20)`` is the byte count drawn).
"""
from __future__ import annotations

MIB = 2 ** 20

#: The classes, in shrink order (the first is the plain case: one bucket for the model).
CAP_CLASSES = ("above_model", "model_exactly", "below_smallest", "one_parameter", "fills_one", "fills_several",
               "below_largest")


def grad_bytes(module) -> list[int]:
    """Bytes of each parameter's gradient that takes part in training, in the order a DDP
    buckets them (reverse registration order; ``requires_grad`` only)."""
    sizes = [p.numel() * p.element_size() for p in module.parameters() if p.requires_grad]
    return sizes[::-1]


def greedy_buckets(sizes: list[int], cap: int) -> list[list[int]]:
    """Torch's rule over ``sizes`` (bytes, bucketing order): add to the open bucket, close it
    once its bytes are ``>= cap``. Returns the buckets as lists of indices into ``sizes``."""
    out, cur, total = [], [], 0
    for i, n in enumerate(sizes):
        cur.append(i)
        total += n
        if total >= cap:
            out.append(cur)
            cur, total = [], 0
    if cur:
        out.append(cur)
    return out


def exactly_full(sizes: list[int], cap: int) -> int:
    """How many buckets :func:`greedy_buckets` closes at exactly ``cap`` bytes."""
    return sum(1 for b in greedy_buckets(sizes, cap) if sum(sizes[i] for i in b) == cap)


def cap_bytes(sizes: list[int], cls: str, k: int = 2) -> int:
    """The cap in bytes of class ``cls`` for gradients of ``sizes`` (bucketing order): one bucket
    not full (``above_model``) or exactly full (``model_exactly``), every parameter its own bucket
    (``below_smallest``), half the largest gradient (``below_largest``: one parameter larger than
    its bucket, the smaller ones bucketed together), the first bucket exactly full with one or ``k`` gradients
    (``one_parameter``, ``fills_one``: ``k`` clipped to ``1..len(sizes)``), or the smallest cap of
    consecutive gradients that closes the most buckets exactly full (``fills_several``).

    Raises:
        ValueError: ``cls`` is not one of :data:`CAP_CLASSES`, or ``sizes`` is empty."""
    if not sizes:
        raise ValueError("no trainable parameter: no bucket to size")
    if cls == "above_model":
        return 2 * sum(sizes)
    if cls == "model_exactly":
        return sum(sizes)
    if cls == "below_smallest":
        return max(1, min(sizes) // 2)
    if cls == "below_largest":
        return max(1, max(sizes) // 2)
    if cls == "one_parameter":
        return sizes[0]
    if cls == "fills_one":
        return sum(sizes[:max(1, min(k, len(sizes)))])
    if cls == "fills_several":
        windows = sorted({sum(sizes[i:j]) for i in range(len(sizes)) for j in range(i + 1, len(sizes) + 1)})
        return max(windows, key=lambda c: (exactly_full(sizes, c), -c))
    raise ValueError(f"unknown bucket cap class {cls!r}; known: {', '.join(CAP_CLASSES)}")


def cap_mb(sizes: list[int], cls: str, k: int = 2) -> float:
    """:func:`cap_bytes` in MiB (exact)."""
    return cap_bytes(sizes, cls, k) / MIB
