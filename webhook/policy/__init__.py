"""The GPUPolicy model, its loading into an immutable PolicySet, and selection for a pod."""

from webhook.policy.loading import PolicySet
from webhook.policy.model import GPUPolicy, PolicyRef

__all__ = ["GPUPolicy", "PolicyRef", "PolicySet"]
