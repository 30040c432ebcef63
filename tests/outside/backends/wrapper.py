"""A correct backend: every collective delegated to a gloo group it owns.

Subclasses override :meth:`Wrapper.fix`, called on each op's outputs once gloo has finished,
to inject one fault. Every collective completes before it returns: the ``Work`` handed back is
done, and its ``get_future()`` (what torch's DDP waits on) holds the op's outputs. A send or a
receive returns at once (its ``Work`` waits for gloo's): a send that blocked until its peer
posted the receive would deadlock a ring in which every rank sends first
(``batch_isend_irecv``), which gloo itself does not.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroupGloo


class DoneWork(dist._Work):
    """A finished op: ``wait()`` returns at once, ``get_future()`` holds ``result``."""

    def __init__(self, result):
        super().__init__()
        self._future = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        return self._future


class PendingWork(dist._Work):
    """A point-to-point op in flight: ``wait()`` waits for gloo's ``Work``, then runs ``fix``."""

    def __init__(self, inner, finish):
        super().__init__()
        self._inner, self._finish, self._done = inner, finish, False

    def wait(self, timeout=None):
        if not self._done:
            self._inner.wait()
            self._finish()
            self._done = True
        return True

    def is_completed(self):
        return self._done

    def is_success(self):
        return self._done


class Wrapper(dist.ProcessGroup):
    """``dist.ProcessGroup`` over a private ``ProcessGroupGloo`` (same rank and size)."""

    NAME = "wrapper"

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self.gloo = ProcessGroupGloo(dist.PrefixStore("inner", store), rank, size, timeout)

    def getBackendName(self):
        return self.NAME

    @property
    def _backend_name(self):
        return self.NAME

    def fix(self, op, outputs, opts):
        """Called with each op's outputs (a list of tensors) after gloo's op: no fault here."""

    def _run(self, op, work, outputs, opts=None):
        work.wait()
        self.fix(op, outputs, opts)
        return DoneWork(outputs)

    def allreduce(self, tensors, opts):
        return self._run("allreduce", self.gloo.allreduce(tensors, opts), tensors, opts)

    def allreduce_coalesced(self, tensors, opts):
        return self._run("allreduce", self.gloo.allreduce_coalesced(tensors, opts), tensors, opts)

    def broadcast(self, tensors, opts):
        return self._run("broadcast", self.gloo.broadcast(tensors, opts), tensors, opts)

    def reduce(self, tensors, opts):
        return self._run("reduce", self.gloo.reduce(tensors, opts), tensors, opts)

    def allgather(self, output_lists, inputs, opts):
        return self._run("allgather", self.gloo.allgather(output_lists, inputs, opts), output_lists[0], opts)

    def _allgather_base(self, output, input, opts):
        return self._run("allgather_base", self.gloo._allgather_base(output, input, opts), [output], opts)

    all_gather_single = _allgather_base  # torch >= 2.10 calls this name

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts):
        return self._run("allgather_base", self.gloo.allgather_into_tensor_coalesced(outputs, inputs, opts),
                         outputs, opts)

    def reduce_scatter(self, outputs, input_lists, opts):
        return self._run("reduce_scatter", self.gloo.reduce_scatter(outputs, input_lists, opts), outputs, opts)

    def _reduce_scatter_base(self, output, input, opts):
        return self._run("reduce_scatter_base", self.gloo._reduce_scatter_base(output, input, opts), [output], opts)

    reduce_scatter_single = _reduce_scatter_base  # torch >= 2.10 calls this name

    def alltoall_base(self, output, input, output_splits, input_splits, opts):
        return self._run("alltoall_base", self.gloo.alltoall_base(output, input, output_splits, input_splits, opts),
                         [output], opts)

    all_to_all_single = alltoall_base  # torch >= 2.10 calls this name

    def alltoall(self, outputs, inputs, opts):
        return self._run("alltoall", self.gloo.alltoall(outputs, inputs, opts), outputs, opts)

    def gather(self, output_lists, inputs, opts):
        outs = output_lists[0] if output_lists else []
        return self._run("gather", self.gloo.gather(output_lists, inputs, opts), outs, opts)

    def scatter(self, outputs, input_lists, opts):
        return self._run("scatter", self.gloo.scatter(outputs, input_lists, opts), outputs, opts)

    def barrier(self, opts):
        return self._run("barrier", self.gloo.barrier(opts), [], opts)

    def _pending(self, op, work, outputs):
        return PendingWork(work, lambda: self.fix(op, outputs, None))

    def send(self, tensors, dst, tag):
        return self._pending("send", self.gloo.send(tensors, dst, tag), tensors)

    def recv(self, tensors, src, tag):
        return self._pending("recv", self.gloo.recv(tensors, src, tag), tensors)

    def recv_anysource(self, tensors, tag):
        return self._pending("recv", self.gloo.recv_anysource(tensors, tag), tensors)


def perturb_middle(t) -> None:
    """Change the middle element of a contiguous tensor in place: flip a bool, add 1/16 of the
    magnitude (+ 1/16) to a float, add 1 to an integer (the faulty backends' one wrong element)."""
    flat, i = t.view(-1), t.numel() // 2
    if t.dtype == torch.bool:
        flat[i] = ~flat[i]
    elif t.is_floating_point() or t.is_complex():
        flat[i] += 0.0625 * (flat[i].abs() + 1)
    else:
        flat[i] += 1


def registrar(cls):
    """``register()`` for ``cls``: registers it under ``cls.NAME`` (CPU) and returns the name."""
    def register():
        dist.Backend.register_backend(cls.NAME, cls, devices=["cpu"])
        return cls.NAME
    return register


register = registrar(Wrapper)
