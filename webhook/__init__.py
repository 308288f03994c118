"""gpugate: GPU pod mutation, load steering and GitOps stack lifecycle for Kubernetes."""

__version__ = "0.1.0"
