"""What a catalog mutant (a :class:`conformance.impls.mutants.catalog.Mutant` row) claims, and
whether the claims hold: checked by the case table's validation
(:mod:`conformance.cases.validation`) against the rows that must kill the mutant.

A mutant's claims are the fields that change how ``conformance.impls.builtin.mutant_impl``
builds it (``honours``, ``unsupported``, ``sync_bn``, ...). A claim with no effect, or one no
killing row uses, is a catalog error; so is a mutant that cannot serve a row naming it (the row
would be ``unsupported`` for it, never a kill).
"""
from __future__ import annotations

from conformance.cases.row import resolve
from conformance.impls.row import DDP_METHOD_NAMES
from conformance.worlds.runtimes import RUNTIMES

#: The fields of a catalog row that name code by reference (:func:`conformance.cases.row.resolve`).
REFERENCES = ("ddp_class", "shard_rank", "sync_bn", "shipped_path")


def ref_ignores() -> frozenset:
    """The torch DDP keywords the reference DDP accepts and ignores (frozenset of str)."""
    from ddp_impl.ddp import IGNORED_TORCH_DDP_KWARGS
    return frozenset(IGNORED_TORCH_DDP_KWARGS)


def reference_problem(m) -> str | None:
    """Why a reference of mutant ``m`` (a catalog row; :data:`REFERENCES`) names nothing, or None."""
    for name in REFERENCES:
        ref = getattr(m, name)
        try:
            resolve(ref)
        except (ImportError, AttributeError, ValueError) as exc:
            return f"has {name} {ref!r}, which names nothing: {type(exc).__name__}: {exc}"
    return None


def claim_problems(m) -> str | None:
    """What mutant ``m`` (a catalog row) claims that has no effect where
    ``conformance.impls.builtin.mutant_impl`` builds it, or a reference of it that names
    nothing (:func:`reference_problem`), or None."""
    unresolved = reference_problem(m)
    if unresolved:
        return unresolved
    if m.shipped_path is not None:
        moot = [f for f in ("ddp_class", "shard_rank", "sync_bn", "honours", "unsupported") if getattr(m, f)]
        if moot or m.torch_based:
            return f"builds a shipped path's row, so its {moot + ['torch_based'] * m.torch_based} have no effect"
        return None
    if m.torch_based and m.honours:
        return f"is torch-based (torch's DDP honours every keyword): honours {list(m.honours)} has no effect"
    unknown = [r for r in (m.unsupported or {}) if r not in RUNTIMES]
    if unknown:
        return f"is unsupported on unknown runtime(s) {unknown}; known: {', '.join(RUNTIMES)}"
    stale = [k for k in m.honours if k not in ref_ignores()]
    if stale:
        return f"claims to honour {stale}, which the reference DDP does not ignore: the claim changes nothing"
    return None


def cannot_serve(m, needs: tuple) -> str | None:
    """Why mutant ``m`` cannot serve a row needing ``needs`` (DDP keywords and methods; the row
    would be ``unsupported`` for it, never a kill), or None. Mutants of shipped paths are not checked."""
    if m.shipped_path is not None:
        return None
    ignored = [k for k in needs if k not in DDP_METHOD_NAMES and not m.torch_based
               and k in ref_ignores() - frozenset(m.honours)]
    if ignored:
        return f"ignores keyword(s) {ignored} the row requires: it would be unsupported there, never killed"
    methods = [k for k in needs if k in DDP_METHOD_NAMES]
    if methods:
        cls = resolve(m.ddp_class)
        missing = [k for k in methods if not callable(getattr(cls, k, None))]
        if missing:
            return f"has no {', '.join(k + '()' for k in missing)}, which the row requires: it would be " \
                   "unsupported there, never killed"
    return None


def unused_claims(m, used) -> list[str]:
    """The claims of mutant ``m`` (keywords it honours; ``sync_bn``) that no row killing it uses.

    ``used``: what the killing rows exercise together (a set of DDP keywords and methods, and
    ``sync_bn`` when one trains a SyncBatchNorm; ``conformance.cases.kinds.Kind.used``).
    """
    unused = [k for k in m.honours if k not in used]
    if m.sync_bn and "sync_bn" not in used:
        unused.append("sync_bn")
    return unused
