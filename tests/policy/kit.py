"""Small builders shared by the policy, mutation and validation tests.

Policies are written as the YAML a platform engineer would commit and loaded through the real
loader (``PolicySet.from_texts``), so every test also exercises parsing and the schema.
"""

from __future__ import annotations

import textwrap
from typing import Any

from webhook.policy import PolicySet, parsing

HEADER = "apiVersion: gpugate.io/v1alpha1\nkind: GPUPolicy\n"


def load(*documents: str, name: str = "p.yaml") -> PolicySet:
    """Load YAML documents (each dedented, joined with ---) as one file."""
    return parsing.parse([(name, "\n---\n".join(textwrap.dedent(d) for d in documents))])


def policy(name: str, spec: str = "", *, priority: int | None = None, mode: str | None = None) -> str:
    """One GPUPolicy document: metadata.name plus a spec body written as indented YAML."""
    lines = [HEADER + f"metadata: {{name: {name}}}", "spec:"]
    if priority is not None:
        lines.append(f"  priority: {priority}")
    if mode is not None:
        lines.append(f"  mode: {mode}")
    body = textwrap.dedent(spec).strip("\n")
    lines.extend("  " + line for line in body.splitlines())
    if len(lines) == 2:
        lines[-1] = "spec: {}"
    return "\n".join(lines) + "\n"


def container(name: str = "main", *, gpus: int | str | None = None, resource: str = "nvidia.com/gpu",
              requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None) -> dict[str, Any]:
    """A container; ``gpus`` sets requests == limits of ``resource`` as a user would write it."""
    out: dict[str, Any] = {"name": name, "image": "registry.example/app:1"}
    res: dict[str, Any] = {}
    if requests is not None:
        res["requests"] = dict(requests)
    if limits is not None:
        res["limits"] = dict(limits)
    if gpus is not None:
        res.setdefault("requests", {})[resource] = str(gpus)
        res.setdefault("limits", {})[resource] = str(gpus)
    if res:
        out["resources"] = res
    return out


def pod(*containers: dict[str, Any], labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, init: list[dict[str, Any]] | None = None,
        name: str | None = "pod-1", generate_name: str | None = None, namespace: str | None = None,
        **spec: Any) -> dict[str, Any]:
    """A Pod dict; extra keyword arguments become spec fields (tolerations=..., affinity=...)."""
    metadata: dict[str, Any] = {}
    if name is not None:
        metadata["name"] = name
    if generate_name is not None:
        metadata["generateName"] = generate_name
    if namespace is not None:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    body: dict[str, Any] = {"containers": list(containers or [container()])}
    if init:
        body["initContainers"] = list(init)
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


# --- evaluating scheduling terms the way kube-scheduler does, to test meaning rather than dicts ---

def requirement_holds(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    """A NodeSelectorRequirement against one node's labels (In, NotIn, Exists, DoesNotExist, Gt, Lt)."""
    key, op, values = expression["key"], expression["operator"], expression.get("values") or []
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        assert len(values) == 1, f"{op} takes exactly one value, got {values}"
        if not present:
            return False
        have, bound = int(labels[key]), int(values[0])
        return have > bound if op == "Gt" else have < bound
    raise AssertionError(f"unknown operator {op}")


def term_holds(term: dict[str, Any], labels: dict[str, str]) -> bool:
    """A term with no expressions and no fields matches no node (nodeaffinity: "an empty term matches
    no objects"); the kit reads node labels only, so a fields-only term is taken as matching."""
    if not term.get("matchExpressions") and not term.get("matchFields"):
        return False
    return all(requirement_holds(e, labels) for e in term.get("matchExpressions") or [])


def node_score(pod_: dict[str, Any], labels: dict[str, str]) -> int:
    """Sum of the weights of the preferred node-affinity terms a node matches (NodeAffinity's raw score)."""
    preferred = (((pod_["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                 .get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    return sum(t["weight"] for t in preferred if term_holds(t["preference"], labels))


def node_feasible(pod_: dict[str, Any], labels: dict[str, str]) -> bool:
    """Required node affinity and nodeSelector (OR across terms, AND inside one)."""
    spec = pod_["spec"]
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    return any(term_holds(t, labels) for t in required.get("nodeSelectorTerms") or [])


def tolerates(toleration: dict[str, Any], taint: dict[str, str]) -> bool:
    """Kubernetes' Toleration.ToleratesTaint."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    operator = toleration.get("operator") or "Equal"
    if not toleration.get("key"):
        return operator == "Exists"
    if toleration["key"] != taint["key"]:
        return False
    return operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or "")
