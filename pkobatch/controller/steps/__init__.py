"""The steps of the reconcile's decision, one concern per module; ``controller.decide``
runs them in order (docs/architecture.md lists them)."""
