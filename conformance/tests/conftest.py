"""Markers of the kit's suite (registered here, not by the installed plugin, so
other projects' marker namespaces stay untouched)."""


def pytest_configure(config):
    for name, text in [("cpu", "runs on the CPU runtime (gloo)"),
                       ("pjrt", "runs on the PJRT runtime (torch_xla)"),
                       ("xrt", "XRT runtime (legacy torch_xla <= 2.0)"),
                       ("slow", "long-running (large world sizes)")]:
        config.addinivalue_line("markers", f"{name}: {text}")
