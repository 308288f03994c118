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


KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def problems(documents: list[Any], where: str) -> list[str]:
    """What keeps ``documents`` (a file's YAML documents) from being pointed at a server: each must be
    a webhook configuration whose webhooks call a Service path, as manifests/webhook ships them."""
    found = [d for d in documents if d is not None]
    if not found:
        return [f"{where}: no webhook configuration in it (expected the {' and '.join(KINDS)} of "
                f"manifests/webhook/webhookconfigurations.yaml)"]
    out = []
    for index, document in enumerate(found, start=1):
        here = f"{where}, document {index}"
        kind = document.get("kind") if isinstance(document, dict) else None
        if kind not in KINDS:
            out.append(f"{here}: expected a {' or a '.join(KINDS)}, got {kind or type(document).__name__!r}")
            continue
        hooks = document.get("webhooks")
        if not isinstance(hooks, list) or not hooks:
            out.append(f"{here}: {kind} has no webhooks list")
            continue
        for number, hook in enumerate(hooks, start=1):
            service = ((hook or {}).get("clientConfig") or {}).get("service") if isinstance(hook, dict) else None
            if not isinstance(service, dict) or not isinstance(service.get("path"), str):
                out.append(f"{here}: webhook {number} has no clientConfig.service.path to point at the local server")
    return out
