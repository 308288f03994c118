"""End-to-end tests against a real Kubernetes control plane on 127.0.0.1 (see README.md here)."""
