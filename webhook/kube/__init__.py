"""Kubernetes' own rules, each written once: quantities, GPU resources, a pod's requests, YAML."""
