"""The GPUPolicy model, its parsing into an immutable PolicySet, and selection for a pod."""

from webhook.policy.model import GPUPolicy, PolicyRef, PolicySet

__all__ = ["GPUPolicy", "PolicyRef", "PolicySet"]
