"""The ``task`` kind: feature cases that run a task of their own on the world and judge its result."""
