"""Examples that are not installed with the kit (run them from the repository root)."""
