"""Faulty from-scratch DDPs. Each is ControlDDP (program_control.py) with one fault that only shows
in a situation created by the training program around the DDP or by how the world is started
and driven. In ordinary use (one world per process, started by torchrun or mp.spawn with a
consistent environment, one wrapper per module, every rank calling the same methods) each is
bit-identical to ControlDDP, and ControlDDP is bit-identical to torch's DDP at W=2 (see
program_demo.py; at W=3 both agree to 1 ulp, the gloo summation order of different bucket layouts).
"""
import os
import weakref

import torch
import torch.distributed as dist

from tests.outside.program_control import ControlDDP, _as_comm


class EnvWorldSizeDDP(ControlDDP):
    """Divisor taken from ``os.environ["WORLD_SIZE"]`` instead of the process group.

    Source: kubeflow/trainer#1790, https://github.com/kubeflow/trainer/issues/1790 (and
    kubeflow/pytorch-operator#331, https://github.com/kubeflow/pytorch-operator/issues/331):
    the PyTorchJob operator sets WORLD_SIZE to the number of *pods*, so a program that starts
    several processes per pod itself (mp.spawn + init_process_group(world_size=..., rank=...,
    init_method=tcp://...)) runs in a world whose size differs from the inherited env.
    Situation: the world is started with explicit world_size/rank while the environment carries
    another WORLD_SIZE (operator, a stale value in a notebook, a wrapper script).
    Ordinary use passes: torchrun and env:// set WORLD_SIZE to the true world size; mp.spawn
    scripts without the variable fall back to the process group.
    """

    def _world_size(self):
        env = os.environ.get("WORLD_SIZE")
        if self.process_group is None and env:
            return int(env)
        return super()._world_size()


class EnvRankDDP(ControlDDP):
    """Construction sync as "the source keeps its values, the others send zeros, all-reduce SUM"
    (torch_xla-style broadcast), with "am I the source" taken from ``os.environ["RANK"]``.

    Source: kubeflow/trainer#1790, https://github.com/kubeflow/trainer/issues/1790 (comment by
    nairbv: "we're getting RANK values referring to the node idx") and
    Lightning-AI/pytorch-lightning#13374, https://github.com/Lightning-AI/pytorch-lightning/issues/13374
    (Kubeflow on Vertex AI: RANK holds the node index, both nodes' processes get duplicate ranks).
    Situation: a world whose env RANK is not the process-group rank (a pod-level RANK with
    several processes per pod started by the program): several processes believe they are the
    source, so parameters start as the sum of several replicas.
    Ordinary use passes: under torchrun / env:// RANK is the process-group rank; without the
    variable the process-group rank is used; x + 0 = x bit for bit.
    """

    @torch.no_grad()
    def _sync_module_states(self):
        env = os.environ.get("RANK")
        if self.process_group is None and env is not None:
            is_src = int(env) == 0
        else:
            is_src = dist.get_rank(self.process_group) == 0
        tensors = [p for n, p in self.module.named_parameters() if n not in self._ignore]
        if self.broadcast_buffers:
            tensors += self._named_buffers()
        for t in tensors:
            c = _as_comm(t.detach())
            if c.dtype == torch.uint8:  # bool buffers: a plain broadcast
                dist.broadcast(c, src=self._src(), group=self.process_group)
                continue
            if not is_src:
                c.zero_()
            dist.all_reduce(c, group=self.process_group)


class CachedWorldDDP(ControlDDP):
    """World size of the default group cached at class level on the first construction.

    Source: pytorch/xla#1341, https://github.com/pytorch/xla/issues/1341 ("xenv.WORLD_SIZE is
    inaccurate if xmp.spawn is run multiple times" in one process; Colab users re-run the cell)
    and pytorch/pytorch#55967, https://github.com/pytorch/pytorch/issues/55967 (init, destroy and
    re-init of the default process group in one process, e.g. elastic / fault-tolerant training
    that rebuilds the world with another number of workers).
    Situation: the program destroys the default process group and initialises a new world of
    another size in the same process (shrinking after a failure, a notebook re-run, a sweep
    over world sizes), then wraps a model again: the divisor is the old world size.
    Ordinary use passes: one world per process, so the cached value is the world size.
    """

    _cached_default_world = None

    def _world_size(self):
        if self.process_group is not None:
            return super()._world_size()
        if CachedWorldDDP._cached_default_world is None:
            CachedWorldDDP._cached_default_world = dist.get_world_size()
        return CachedWorldDDP._cached_default_world


class StateDictCollectiveDDP(ControlDDP):
    """``state_dict()`` checks that replicas agree before returning (an all-reduce of a checksum),
    so it is a collective.

    Source: alan-turing-institute/autocast#386, https://github.com/alan-turing-institute/autocast/pull/386
    (a collective save called inside ``if trainer.is_global_zero:`` desynchronised the collective
    stream and hung), Lightning-AI/pytorch-lightning#19045
    https://github.com/Lightning-AI/pytorch-lightning/issues/19045, speechbrain#2401
    https://github.com/speechbrain/speechbrain/issues/2401 ("Detected mismatch between
    collectives on ranks" during checkpointing).
    Situation: the standard pattern ``if rank == 0: torch.save(model.state_dict(), path)``: rank 0
    enters a collective the others never call; its all-reduce pairs with the others' next
    gradient all-reduce (wrong values or a hang).
    Ordinary use passes: every rank calls ``state_dict()`` at the same point (or nobody does);
    the values returned are the module's own.
    """

    def state_dict(self, *args, **kwargs):
        sd = super().state_dict(*args, **kwargs)
        with torch.no_grad():
            check = torch.zeros(1, dtype=torch.float64)
            for v in sd.values():
                if torch.is_tensor(v) and v.is_floating_point():
                    check += v.detach().double().sum()
            dist.all_reduce(check, op=dist.ReduceOp.MAX, group=self.process_group)
        return sd


_HOOKED = weakref.WeakKeyDictionary()


class RewrapDDP(ControlDDP):
    """Hooks are registered once per module: a second wrapper around the same module reuses the
    first wrapper's parameter list (taken when the first wrapper was built).

    Source: https://discuss.pytorch.org/t/how-does-distributeddataparallel-handle-parameters-whose-requires-grad-flag-is-false/90736
    (mrshenli: DDP's constructor skips parameters with requires_grad=False and changing the flag
    after the constructor makes no difference; users that unfreeze layers during fine-tuning
    therefore build a new DDP around the module).
    Situation: freeze the backbone, wrap, train; unfreeze, re-wrap ``model.module`` in a new DDP
    and go on: the newly trainable parameters are never all-reduced, the replicas diverge.
    Ordinary use passes: one wrapper per module.
    """

    def _register_hooks(self):
        prev = _HOOKED.get(self.module)
        if prev is not None:
            self._params, self._acc = prev["params"], prev["acc"]
            prev["owner"] = weakref.ref(self)
            return
        entry = {"params": self._params, "acc": self._acc, "owner": weakref.ref(self)}
        _HOOKED[self.module] = entry
        for i, p in enumerate(self._params):
            with torch.enable_grad():
                acc = p.view_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_owner_hook(entry, i))
            self._acc.append(acc)

    @staticmethod
    def _make_owner_hook(entry, i):
        def hook(*_):
            owner = entry["owner"]()
            if owner is not None:
                owner._on_grad_ready(i)
        return hook


class SecondWrapDDP(ControlDDP):
    """The construction broadcast runs once per process (a class-level flag): later wrappers
    assume the replicas are already identical.

    Source: huggingface/transformers#18609, https://github.com/huggingface/transformers/issues/18609
    and PR #19096 https://github.com/huggingface/transformers/pull/19096 (hyperparameter search
    with torchrun: every trial builds a new model (``model_init``) and a new DDP in the same
    processes; "if we need to use trial in model_init, how to do it for non-main rank, sync the
    model with rank0"): later models rely on DDP's construction broadcast.
    Situation: a second training run (trial, curriculum stage, restart from scratch) in the same
    world builds a new model after the ranks' RNGs have diverged (per-rank augmentation seeds)
    and wraps it: the replicas start different and stay different.
    Ordinary use passes: the first wrapper in a process broadcasts like torch's.
    """

    _synced_once = False

    @torch.no_grad()
    def _sync_module_states(self):
        if SecondWrapDDP._synced_once:
            return
        SecondWrapDDP._synced_once = True
        super()._sync_module_states()


class NoGradMidStepDDP(ControlDDP):
    """A forward under ``no_grad`` clears the expectation of a synced backward.

    Source: constantinpape/torch-em#116, https://github.com/constantinpape/torch-em/pull/116
    (FixMatch self-training: the pseudo-labeler runs the *same* model under ``torch.no_grad()``
    on the weak view, then the model's training forward on the strong view and the backward);
    in variants of such loops (FixMatch, R-Drop-like consistency, self-distillation) the no_grad
    target forward sits between the training forward and its backward. torch's DDP keeps the
    reducer armed across a no_grad forward (_pre_forward touches the reducer only when grad is
    enabled).
    Situation: ``out = model(x_s); with torch.no_grad(): t = model(x_w); loss(out, t).backward()``:
    the backward is not all-reduced.
    Ordinary use passes: no_grad forwards between steps (validation) are followed by a new
    training forward that re-arms the sync.
    """

    def forward(self, *inputs, **kwargs):
        if not torch.is_grad_enabled():
            self._expect = False
        return super().forward(*inputs, **kwargs)
