"""GitOps tests: Argo CD manifests, health checks, the argocd-cm patch and the chart values check."""
