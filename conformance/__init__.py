"""DDP conformance kit: parity checks of data-parallel training against a
single-device reference, on CPU (gloo), PJRT and XRT runtimes.

Public names: :class:`Strategy` - how a data-parallel implementation trains (wrap or leave the
model, its optimizer, what runs between backward and the step or replaces the step, how to read
sharded optimizer state, topology); ``--ddp package.module:obj`` accepts one
(docs/strategies.md). :class:`UserModel` - your own model (build, batches, loss) for
``--model package.module:factory`` (docs/configuration.md, "Your own model")."""
from conformance.impls.row import Strategy
from conformance.cases.usermodel import UserModel

__all__ = ["Strategy", "UserModel"]
