"""Faulty backend written from scratch (no wrapper.py): a Python ProcessGroup over its own gloo group that sends a
reduce's result to group rank 0 whatever root the caller asked for (a backend that ignores
ReduceOptions.rootRank). Broadcast and everything else are gloo's own."""
import torch
import torch.distributed as dist
from torch.distributed import ProcessGroupGloo


class Done(dist._Work):
    def __init__(self, value):
        super().__init__()
        self.fut = torch.futures.Future()
        self.fut.set_result(value)

    def wait(self, timeout=None):
        return True

    def get_future(self):
        return self.fut


class Rootless(dist.ProcessGroup):
    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self.g = ProcessGroupGloo(dist.PrefixStore("rl", store), rank, size, timeout)

    def getBackendName(self):
        return "rootless"

    def __getattr__(self, name):  # every other op: gloo's
        return getattr(self.__dict__["g"], name)

    def reduce(self, tensors, opts):
        o = dist.ReduceOptions()
        o.reduceOp, o.rootRank, o.rootTensor = opts.reduceOp, 0, opts.rootTensor  # the fault: root 0
        w = self.g.reduce(tensors, o)
        w.wait()
        return Done(tensors)

    def allreduce(self, tensors, opts):
        w = self.g.allreduce(tensors, opts); w.wait(); return Done(tensors)

    def broadcast(self, tensors, opts):
        w = self.g.broadcast(tensors, opts); w.wait(); return Done(tensors)

    def barrier(self, opts):
        w = self.g.barrier(opts); w.wait(); return Done([])


def register():
    dist.Backend.register_backend("rootless", Rootless, devices=["cpu"])
    return "rootless"
