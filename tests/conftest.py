"""Fixtures of the kit's own meta-tests (not installed with the kit)."""
import pytest


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
    from conformance.cases.train.parity import ParityRunner
    return ParityRunner(conformance_session)
