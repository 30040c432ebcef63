"""User strategies certified by the kit: docs/strategies.md."""
