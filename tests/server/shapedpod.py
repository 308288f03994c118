"""The pod the create-latency benchmark creates, and the body of its ``shaped`` arm.

``benchmarks/create_latency.py`` creates these; ``tests/server/test_create_latency_arms.py`` checks
that the shaped arm's body is the user's pod plus exactly what gpugate's patch set. A benchmark may
import a test helper, never the other way round, so the two live on this side.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.e2e.webhook_fixture import pod_manifest

Obj = dict[str, Any]


def the_pod(name: str) -> Obj:
    """The user's plain GPU pod: one label, no GPU YAML."""
    return pod_manifest(name, labels={"gpugate.io/gpus": "1"})


def shaped_body(created: Obj, patch: list[Obj]) -> Obj:
    """The user's pod with what gpugate's ``patch`` set, taken from ``created`` (the API server's
    answer to a create in the gpugate arm): for each operation, the field it adds or replaces, two
    levels under ``metadata`` or ``spec`` (``/spec/tolerations/-`` copies the whole list). Nothing
    else of the stored pod is copied: a client that sends every defaulted field makes the API
    server track all of them in ``managedFields``, a cost the webhook's pods do not have."""
    body = the_pod("shaped")
    del body["metadata"]["name"]
    for op in patch:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        # /spec/containers/0/resources keeps its index; a list element (/spec/tolerations/2) does not
        depth = 4 if tokens[:2] == ["spec", "containers"] else 2
        source, target = created, body
        for i, token in enumerate(tokens[:depth]):
            key: Any = int(token) if isinstance(source, list) else token
            source = source[key]
            if i == len(tokens[:depth]) - 1:
                target[key] = copy.deepcopy(source)
            else:
                target = target[key] if isinstance(target, list) else target.setdefault(key, {})
    return body
