"""Module-axis fault 4 (issue 25 item 6): the gradient hooks (and the reduction list) are built
by walking ``named_modules()`` and each module's direct ``_parameters``, skipping
``nn.ParameterList`` / ``nn.ParameterDict`` containers: parameters held in them are broadcast at
construction but their gradients are never all-reduced (each replica keeps its local one).

Module dimension: parameters in ``nn.ParameterList`` / ``nn.ParameterDict``. Modelled on
pytorch/pytorch#36035 (ParameterList / ParameterDict parameters lost by DataParallel's and
single-process multi-device DDP's replication). Everything else is ``module_axis_correct.Class``.
"""

from torch import nn

from tests.outside.module_axis_correct import Class as _Correct


class Class(_Correct):
    def _grad_params(self):
        out, seen = [], set()
        for _, m in self.module.named_modules():
            if isinstance(m, (nn.ParameterList, nn.ParameterDict)):
                continue  # FAULT: container parameters skipped
            for p in m._parameters.values():
                if p is not None and p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out
