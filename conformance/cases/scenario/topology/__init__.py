"""The topology generator: random module graphs of torch.nn layers (composite ones included),
every workload corner placed at any node, built identically by every replica and the oracle.

The one door: :func:`build_topology` (the module), :func:`topologies` (the Hypothesis strategy),
:func:`validate_topology` / :class:`TopologyError` (a replayed file's check), :func:`needs` (what
a topology asks of the scenario around it), :data:`RETURNS` (its output structures),
:func:`corners` / :func:`describe` (how a verdict and the docs name it). The format: :mod:`.spec`;
which topologies draw each corner: docs/topologies.md.
"""
from conformance.cases.scenario.topology.draw import topologies
from conformance.cases.scenario.topology.net import build_topology
from conformance.cases.scenario.topology.spec import (MAX_NODES, RETURNS, TopologyError, corners, describe, needs,
                                                      validate_topology)

__all__ = ["MAX_NODES", "RETURNS", "TopologyError", "build_topology", "corners", "describe", "needs", "topologies",
           "validate_topology"]
