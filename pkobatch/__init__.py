"""pkobatch: a Job-based reconciler for Pulumi stacks on Kubernetes."""

__version__ = "0.1.0"
