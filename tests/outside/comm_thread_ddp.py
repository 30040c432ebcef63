"""A from-scratch DDP whose gradient all-reduce runs on a background Python thread.

Only torch and torch.distributed are used (nothing from the kit).

* construction: parameters (and buffers, if ``broadcast_buffers``) broadcast from rank 0;
* forward: buffers broadcast from rank 0 like torch DDP (``broadcast_buffers=True``, decided by
  the previous forward exactly like torch's ``require_forward_param_sync``);
* backward: the first gradient hook of a backward queues an engine callback; the callback (end
  of backward, main thread) puts the gradients on a queue; a communication thread owned by the
  wrapper all-reduces them (SUM) and divides by the world size; the main thread waits for that
  result before backward returns;
* ``no_sync()``: gradients accumulate locally, the next synchronised backward reduces the sum;
* parameters without a gradient on some replicas are reduced with a zero contribution; those
  without a gradient anywhere keep ``grad=None`` (like torch DDP's unused parameters).

``CommThreadHangDDP``: on rank 1 only, at the 2nd synchronised backward, the communication
thread sleeps 600 s before its all_reduce (the main thread waits for it).
"""

import contextlib
import queue
import threading
import time

import torch
import torch.distributed as dist
from torch import nn


class _Job:
    __slots__ = ("grads", "done", "error", "sync_index")

    def __init__(self, grads, sync_index):
        self.grads = grads  # list of (param, grad-or-None)
        self.done = threading.Event()
        self.error = None
        self.sync_index = sync_index


class CommThreadDDP(nn.Module):
    def __init__(self, module, device_ids=None, output_device=None, broadcast_buffers=True,
                 process_group=None, find_unused_parameters=False, bucket_cap_mb=None,
                 **kwargs):
        # bucket_cap_mb is accepted and ignored: gradients are reduced per parameter, which
        # gives the same values as any bucketing (no bucket views are exposed).
        if kwargs:
            raise TypeError(f"CommThreadDDP does not implement: {sorted(kwargs)}")
        if device_ids not in (None, []) or output_device is not None:
            raise TypeError("CommThreadDDP is CPU-only: device_ids/output_device unsupported")
        super().__init__()
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.process_group = process_group
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._world = dist.get_world_size(process_group)
        self._src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._callback_queued = False
        self._sync_count = 0

        # module-state broadcast at construction (on the main thread; no thread runs yet);
        # like torch DDP, buffers only when broadcast_buffers is on
        states = list(module.parameters())
        if broadcast_buffers:
            states += list(module.buffers())
        with torch.no_grad():
            for t in states:
                self._broadcast_(t)

        for p in self._params:
            p.register_hook(self._grad_hook)

        self._jobs = queue.Queue()
        self._thread = threading.Thread(target=self._comm_loop, name="ddp-comm", daemon=True)
        self._thread.start()

    # ---- helpers -------------------------------------------------------------------------
    def _broadcast_(self, t):
        if t.is_contiguous():
            dist.broadcast(t.data, src=self._src, group=self.process_group)
        else:
            buf = t.detach().contiguous()
            dist.broadcast(buf, src=self._src, group=self.process_group)
            t.data.copy_(buf)

    def _all_reduce_(self, t, op=dist.ReduceOp.SUM):
        dist.all_reduce(t, op=op, group=self.process_group)

    # ---- communication thread ------------------------------------------------------------
    def _comm_loop(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._reduce(job)
            except BaseException as e:  # handed to the main thread
                job.error = e
            finally:
                job.done.set()

    def _before_all_reduce(self, job):
        pass

    def _reduce(self, job):
        self._before_all_reduce(job)
        n = len(job.grads)
        # which parameters have a gradient somewhere, and its sparse dim + 1 if sparse
        flags = torch.zeros(2 * n, dtype=torch.int64)
        for i, (p, g) in enumerate(job.grads):
            if g is not None:
                flags[i] = 1
                if g.is_sparse:
                    flags[n + i] = g.sparse_dim() + 1
        self._all_reduce_(flags, op=dist.ReduceOp.MAX)
        results = []
        for i, (p, g) in enumerate(job.grads):
            if flags[i] == 0:
                results.append(None)
                continue
            sparse_dim = int(flags[n + i]) - 1
            if g is None:
                if sparse_dim >= 0:
                    g = torch.sparse_coo_tensor(
                        torch.zeros((sparse_dim, 0), dtype=torch.int64),
                        torch.zeros((0,) + tuple(p.shape[sparse_dim:]), dtype=p.dtype),
                        p.shape)
                else:
                    g = torch.zeros_like(p, memory_format=torch.preserve_format)
            if g.is_sparse:
                g = g.coalesce()
                self._all_reduce_(g)
                results.append(g / self._world)
            elif g.is_contiguous() or g.is_contiguous(memory_format=torch.channels_last):
                self._all_reduce_(g)
                g.div_(self._world)
                results.append(g)
            else:
                buf = g.contiguous()
                self._all_reduce_(buf)
                buf.div_(self._world)
                g.copy_(buf)
                results.append(g)
        job.grads = results

    # ---- autograd ----------------------------------------------------------------------
    def _grad_hook(self, grad):
        if self.require_backward_grad_sync and not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        return grad

    def _end_of_backward(self):
        self._callback_queued = False
        self._sync_count += 1
        job = _Job([(p, p.grad) for p in self._params], self._sync_count)
        self._jobs.put(job)
        job.done.wait()  # the main thread waits for the communication thread's result
        if job.error is not None:
            raise RuntimeError("gradient all-reduce failed on the communication thread") \
                from job.error
        with torch.no_grad():
            for p, g in zip(self._params, job.grads):
                if g is None:
                    continue
                if p.grad is None or p.grad.is_sparse or g.is_sparse:
                    p.grad = g
                elif p.grad is not g:
                    p.grad.copy_(g)

    # ---- forward / no_sync -------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self.require_forward_param_sync and self.broadcast_buffers:
            with torch.no_grad():
                for b in self.module.buffers():
                    self._broadcast_(b)
        out = self.module(*args, **kwargs)
        self.require_forward_param_sync = (
            torch.is_grad_enabled() and self.require_backward_grad_sync)
        return out

    @contextlib.contextmanager
    def no_sync(self):
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old


class CommThreadHangDDP(CommThreadDDP):
    """Rank 1's communication thread sleeps 600 s before the 2nd synchronised all-reduce."""

    def _before_all_reduce(self, job):
        if dist.get_rank() == 1 and job.sync_index == 2:
            time.sleep(600)
