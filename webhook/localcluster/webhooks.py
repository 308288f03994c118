"""gpugate's webhook configurations pointed at a server by URL instead of a Service.

A control plane without kube-proxy (this package's, or any API server outside the cluster's
network) cannot reach a Service; the API server then calls ``clientConfig.url`` and trusts
``caBundle`` (../shared/reference/local-control-plane.md section 6). Everything else of the
rendered configuration stays as manifests/ ship it.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

Obj = dict[str, Any]


def pointed_at(config: Obj, base_url: str, ca_pem: bytes) -> Obj:
    """``config`` (a Mutating/ValidatingWebhookConfiguration) calling ``base_url`` + each webhook's Service path."""
    out = copy.deepcopy(config)
    for hook in out["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": base_url.rstrip("/") + path, "caBundle": base64.b64encode(ca_pem).decode()}
    return out
