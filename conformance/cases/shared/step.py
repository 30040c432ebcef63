"""The step protocol: how every case kind builds a model through a
:class:`~conformance.impls.row.Strategy` and drives its training step (docs/strategies.md, "The
step protocol"). One door, :func:`construct`, returns an :class:`Engine`; the training runs, the
feature tasks, the gradient properties, the scenarios and the loop programs all step through it,
so an engine that owns its backward, its step or its gradients is called the same way by each.
"""
from __future__ import annotations

import contextlib

from conformance.errors import Unsupported

#: DDP methods a case may require (an implementation without one is unsupported).
DDP_METHODS = ("join", "register_comm_hook", "no_sync")
#: Performance-only keywords (torch's DDP: they change bucketing, not the result). A case that
#: passes one without requiring it (``parity.mlp``'s ``bucket_cap_mb``) runs without it when the
#: DDP refuses it with ``TypeError``; a case that requires one (the bucket cases) is unsupported.
PERFORMANCE_HINTS = ("bucket_cap_mb", "gradient_as_bucket_view")


def require(ddp, impl, requires) -> None:
    """Raise :class:`~conformance.errors.Unsupported` if ``ddp`` (built by the
    :class:`~conformance.impls.row.Strategy` ``impl``) cannot serve ``requires``: a need the row
    declares unsupported, a keyword it ``ignores`` (the reference DDP accepts some torch keywords
    and ignores them, with a warning; another DDP raises ``TypeError``, :func:`wrap`), a missing
    method of :data:`DDP_METHODS`."""
    for need in requires:
        if need in impl.unsupported_features:
            raise Unsupported(f"{impl.name}: {impl.unsupported_features[need]}")
        if need in impl.ignores:
            raise Unsupported(f"{impl.name} ignores constructor argument {need}")
        if need in DDP_METHODS and not callable(getattr(ddp, need, None)):
            raise Unsupported(f"{impl.name} has no {need}()")


def _call_wrap(impl, module, ctx, kwargs, optimizer):
    if impl.optimizer_first:
        return impl.wrap(module, ctx, dict(kwargs), optimizer)
    return impl.wrap(module, ctx, dict(kwargs))


def wrap(impl, module, ctx, kwargs: dict, requires=(), optional=(), optimizer=None):
    """``impl.wrap(module, ctx, kwargs)`` (with ``optimizer`` last where the strategy builds its
    wrapper around an optimizer: ``optimizer_first``), then :func:`require`. A refused
    :data:`PERFORMANCE_HINTS` keyword, or one of ``optional`` (keywords this run's semantics do not
    depend on), not in ``requires`` is dropped and the construction retried without it. Returns
    what ``wrap`` returned (for ``optimizer_first``, the model or ``(model, optimizer)``).

    Raises:
        Unsupported: a required keyword is refused with ``TypeError`` (the
            constructor contract: refuse what you do not implement) or ignored,
            or a required method is missing.
    """
    kwargs = dict(kwargs)
    while True:
        try:
            built = _call_wrap(impl, module, ctx, kwargs, optimizer)
            break
        except TypeError as exc:
            refused = [k for k in kwargs if k in str(exc)]
            if not refused:
                raise
            hints = [k for k in refused if (k in PERFORMANCE_HINTS or k in optional) and k not in requires]
            if not hints:
                raise Unsupported(f"{impl.name} refuses keyword {refused[0]}: {exc}") from None
            for k in hints:
                del kwargs[k]
    require(built[0] if isinstance(built, tuple) else built, impl, requires)
    return built


class Engine:
    """One replica's wrapped model and optimizer, stepped through the strategy's protocol.

    Attributes: ``row`` (the Strategy), ``ctx``, ``model`` (what ``wrap`` returned), ``opt`` (the
    optimizer the step uses: the strategy's where its ``wrap`` returned one).
    """

    def __init__(self, row, ctx, model, opt):
        self.row, self.ctx, self.model, self.opt = row, ctx, model, opt

    def _hook(self, name) -> None:
        fn = getattr(self.row, name)
        if fn is not None:
            fn(self.model, self.opt, self.ctx)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The strategy's ``zero_grad``, else ``optimizer.zero_grad(set_to_none)``."""
        if self.row.zero_grad is not None:
            self.row.zero_grad(self.model, self.opt, self.ctx)
        else:
            self.opt.zero_grad(set_to_none=set_to_none)

    def before_forward(self) -> None:
        """The strategy's ``before_forward``: once per optimizer step, before its first forward."""
        self._hook("before_forward")

    def backward(self, loss) -> None:
        """The strategy's ``backward(model, loss, optimizer, ctx)``, else ``loss.backward()``."""
        if self.row.backward is not None:
            self.row.backward(self.model, loss, self.opt, self.ctx)
        else:
            loss.backward()

    def sync(self) -> None:
        """The strategy's ``after_backward``: after the step's last backward, before reading gradients."""
        self._hook("after_backward")

    def step(self) -> None:
        """The strategy's ``optimizer_step`` (else ``optimizer.step()``), then its ``after_step``."""
        if self.row.optimizer_step is not None:
            self.row.optimizer_step(self.model, self.opt, self.ctx)
        else:
            self.opt.step()
        self._hook("after_step")

    def full_params(self, module):
        """A context inside which every parameter of ``module`` holds its full value: the
        strategy's ``gather_params`` (collectives on entry and exit: every replica enters),
        else nothing to do."""
        if self.row.gather_params is None:
            return contextlib.nullcontext()
        return self.row.gather_params(module, self.model, self.opt, self.ctx)

    @property
    def grads_in_place(self) -> bool:
        """Gradients are every parameter's ``.grad`` (no other attribute, no gather)."""
        return self.row.grad_attribute == "grad" and self.row.gather_grads is None

    def grads(self, module, synced: bool = True) -> list:
        """The gradient of every parameter of ``module`` (``parameters()`` order): a tensor shaped
        like the parameter, or ``None``. Synchronised: read through the strategy's
        ``gather_grads`` (a collective: every replica calls it) or its ``grad_attribute``;
        ``synced=False`` (after a backward under ``no_sync()``): the replica's local
        ``grad_attribute``."""
        if synced and self.row.gather_grads is not None:
            got = list(self.row.gather_grads(module, self.model, self.opt, self.ctx))
            n = sum(1 for _ in module.parameters())
            if len(got) != n:
                raise ValueError(f"{self.row.name}: gather_grads returned {len(got)} gradients for {n} parameters")
            return got
        return [getattr(p, self.row.grad_attribute, None) for p in module.parameters()]

    def require_grads_in_place(self, what: str) -> None:
        """Raise :class:`~conformance.errors.Unsupported` where ``what`` (an edit of ``.grad``
        between backward and step: loss unscaling, clipping) cannot reach the strategy's gradients."""
        if not self.grads_in_place:
            where = (f"attribute {self.row.grad_attribute!r}" if self.row.gather_grads is None
                     else "shards read through gather_grads")
            raise Unsupported(f"{self.row.name} keeps its synchronised gradients in {where}, not .grad: "
                              f"{what} edits .grad")


def construct(row, module, ctx, kwargs: dict, make_optimizer, requires=(), optional=()) -> Engine:
    """Build ``module`` (on ``ctx.device``) into an :class:`Engine` in the strategy's order:
    ``wrap`` then ``make_optimizer(model.parameters())``, or (``optimizer_first``)
    ``make_optimizer(module.parameters())`` then ``wrap(module, ctx, kwargs, optimizer)``, whose
    ``(model, optimizer)`` result replaces the optimizer. ``make_optimizer``: ``params ->
    torch.optim.Optimizer`` (the case's). Raises as :func:`wrap`."""
    opt = make_optimizer(module.parameters()) if row.optimizer_first else None
    built = wrap(row, module, ctx, kwargs, requires, optional, optimizer=opt)
    if isinstance(built, tuple):
        if not row.optimizer_first or len(built) != 2:
            raise TypeError(f"{row.name}: wrap returned a tuple; only an optimizer_first strategy returns "
                            "(model, optimizer)")
        built, opt = built
    if opt is None:
        opt = make_optimizer(built.parameters())
    return Engine(row, ctx, built, opt)
