"""Fixtures of the kit's own meta-tests (not installed with the kit)."""
import signal
import warnings

import pytest

WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def signal_dispositions_kept(request):
    """Puts SIGINT / SIGTERM back as they were if a test changed them, and warns naming it: a
    test process left ignoring SIGINT makes every child it starts later deaf to Ctrl-C (a child
    inherits an ignored signal and Python keeps it ignored), which failed the CLI signal tests
    of two full runs that passed alone."""
    before = {sig: signal.getsignal(sig) for sig in WATCHED_SIGNALS}
    yield
    for sig, handler in before.items():
        now = signal.getsignal(sig)
        if now != handler:
            signal.signal(sig, handler)
            warnings.warn(f"{request.node.nodeid} left {sig.name} as {now!r} (was {handler!r}); restored")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``long`` first (stable otherwise): pytest-xdist hands tests out in
    collection order, so a minute-long test collected last would be the run's tail."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session")
def world_pool(conformance_world_pool):
    """The plugin's session worlds under the short name the meta-tests use."""
    return conformance_world_pool


@pytest.fixture(scope="session")
def runner(conformance_session):
    """``verdicts(runtime, w, impl, model, **overrides) -> {check: Verdict}`` of ``parity.<model>``."""
    from conformance.cli.parity import ParityRunner
    return ParityRunner(conformance_session)
