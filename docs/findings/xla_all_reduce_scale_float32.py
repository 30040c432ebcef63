"""Finding: torch_xla's all-reduce applies its `scale` in float32, also to float64 tensors
(torch_xla 2.9, PJRT_DEVICE=CPU, one process).

`xm.all_reduce(REDUCE_SUM, tensors, scale=s)` returns the sum times float32(s), not times s: a
float64 tensor reduced with scale=1/3 is off by about 3e-8 relative (float64's step is 1e-16).
`xm.reduce_gradients(optimizer)`, the data-parallel recipe's gradient average, passes
scale=1/world_size, so at a world size that is no power of two (3, 5, 6, ...) every float64
gradient is averaged with float32 precision. No error, no warning. The control: the same
all-reduce with scale=1.0 followed by a float64 division on the device is exact.

One device is enough: XLA_ALWAYS_ALLREDUCE=1 makes torch_xla run the all-reduce (and its scale)
on a world of one, where the sum is the tensor itself; the kit measured the same error on 3
replicas (parity.float64 on the xla_recipe row, W=3).

Run: python xla_all_reduce_scale_float32.py   (needs torch_xla 2.9; one process)
Exit 0: reproduces; 3: the scale is applied in float64 now; 4: anything else (including a
control that fails, or a timeout).
"""
import os
import sys
import threading

TIMEOUT_S = 300
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ["XLA_ALWAYS_ALLREDUCE"] = "1"

import torch  # noqa: E402

try:
    import numpy as np  # noqa: E402
    import torch_xla  # noqa: E402
    import torch_xla.core.xla_model as xm  # noqa: E402
except ImportError as exc:
    print(f"torch_xla is not installed: {exc}")
    sys.exit(4)

#: float64 values of a gradient's magnitudes, and the scales reduce_gradients passes at W=3, 5, 2
VALUES = [1.0, 0.1, 3.0, 1e-2, 0.7316, 2.0 ** -30]
SCALES = (1 / 3, 1 / 5, 1 / 2)


def measure():
    dev = torch_xla.device()
    x = torch.tensor(VALUES, dtype=torch.float64)
    rows = []
    for scale in SCALES:
        scaled = xm.all_reduce(xm.REDUCE_SUM, [x.to(dev)], scale=scale)[0]
        control = xm.all_reduce(xm.REDUCE_SUM, [x.to(dev)], scale=1.0)[0] / (1 / scale)
        scaled, control = scaled.cpu(), control.cpu()
        exact, f32 = x * scale, x * float(np.float32(scale))
        rows.append((scale, scaled.dtype, (scaled - exact).abs().max().item(),
                     torch.equal(scaled, f32), torch.equal(control, x / (1 / scale))))
    return rows


def main():
    result = []
    worker = threading.Thread(target=lambda: result.append(measure()), daemon=True)
    worker.start()
    worker.join(TIMEOUT_S)
    if not result:
        print("timed out or raised")
        return 4
    wrong = []
    for scale, dtype, dev, is_f32, control_ok in result[0]:
        print(f"scale {scale:.17g}: {dtype}, max |result - x*scale| = {dev:.3g}, "
              f"equals x*float32(scale): {is_f32}; scale=1.0 then /{1 / scale:g} exact: {control_ok}")
        if not control_ok or dtype != torch.float64:
            return 4
        if dev > 0:
            wrong.append(scale)
    exact_in_f32 = [s for s in SCALES if float(np.float32(s)) == s]
    if not wrong:
        return 3
    return 0 if sorted(wrong) == sorted(s for s in SCALES if s not in exact_in_f32) else 4


if __name__ == "__main__":
    sys.exit(main())
