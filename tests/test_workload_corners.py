"""The workload corners' readback and naming (issue 18): a complex or float64 parameter is read
back without losing information, and a verdict names a tensor with its corner."""
import numpy as np
import pytest
import torch

from conformance.cases.shared.checks import Names
from conformance.cases.shared.readback import corner, flat_params, param_layout
from fixtures import build_model, global_batch

pytestmark = pytest.mark.cpu


def test_complex_params_read_back_as_real_imaginary_pairs():
    m = build_model("complex64", seed=3)
    flat = flat_params(m)
    w = m.w.detach()
    assert flat.dtype == np.float32 and flat.size == 2 * w.numel() + 16 * 4 + 4
    np.testing.assert_array_equal(flat[:2 * w.numel()], torch.view_as_real(w).reshape(-1).numpy())
    assert w.imag.abs().max() > 0  # the imaginary part is initialised, so losing it would show


def test_float64_params_read_back_in_float64():
    m = build_model("float64", seed=3)
    flat = flat_params(m)
    assert flat.dtype == np.float64
    np.testing.assert_array_equal(flat[:160], m.fc.weight.detach().reshape(-1).numpy())


def test_strided_params_read_back_in_logical_order():
    m = build_model("channels_last", seed=3)
    assert not m.conv.weight.is_contiguous() and not m.t.is_contiguous()
    names = [n for n, _ in m.named_parameters()]
    flat, off = flat_params(m), 0
    for n, p in m.named_parameters():
        np.testing.assert_array_equal(flat[off:off + p.numel()], p.detach().contiguous().reshape(-1).numpy(), n)
        off += p.numel()
    assert names[0] == "t"


def test_layout_names_each_corner():
    got = {e[0]: (e[2] if len(e) > 2 else "") for m in ("sparse_embedding", "channels_last", "complex64",
                                                         "float64", "mixed_dtype")
           for e in param_layout(build_model(m, seed=0))}
    assert got["emb.weight"] == "sparse gradient" and got["head.weight"] == ""
    assert got["conv.weight"] == "channels_last" and got["t"] == "non-contiguous"
    assert got["w"] == "complex64" and got["fc.weight"] == "float64" and got["low.weight"] == "bfloat16"
    assert corner(torch.zeros(3)) == ""


def test_a_verdict_names_the_corner():
    layout = param_layout(build_model("complex64", seed=0))
    names = Names(layout, 8 * 8 * 2 + 16 * 4 + 4)
    assert names.entry(5) == "'w' (complex64) [8, 8, 2] at flat index 5"
    assert names.listing([0, 1]) == "'w' (complex64), 'head.weight'"


def test_corner_models_are_deterministic_and_train_on_their_inputs():
    for name in ("sparse_embedding", "channels_last", "complex64", "float64", "mixed_dtype"):
        a, b = build_model(name, seed=5), build_model(name, seed=5)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters())), name
        x, _ = global_batch(name, 1, 0, 6)
        assert a(x).shape == (6, 4), name
