"""What a pod became once the API server admitted it, or why it was refused: one line a person reads.

``gpugate smoke`` (the chart's ``helm test``) and ``gpugate demo`` show admitted pods the same way:
the policy that shaped it (the webhook's ``gpugate.io/policy`` annotation), the GPU resources it
now asks for, the node it landed on. A refusal keeps the API server's message, which carries the
webhook's own. Pure: pods (dicts as the API returns them) in, values out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from webhook import names
from webhook.kube import demand, pods
from webhook.kube.pods import Pod


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """One pod's fate at admission (and, once scheduled, its node)."""

    name: str
    namespace: str
    policy: str | None = None
    """``NAME@REVISION`` from the webhook's annotation; None when no policy shaped the pod."""
    gpus: tuple[tuple[str, int], ...] = ()
    """The pod's effective GPU requests, sorted by resource."""
    node: str | None = None
    phase: str | None = None
    denied: str | None = None
    """The API server's refusal message; set only for a pod that was not created."""

    @property
    def shaped(self) -> bool:
        return self.policy is not None

    def asks(self) -> str:
        """``nvidia.com/gpu: 4`` (several joined by commas), ``-`` when the pod asks for no GPU."""
        return ", ".join(f"{resource}: {count}" for resource, count in self.gpus) or "-"


def admitted(pod: Pod, *, namespace: str) -> Outcome:
    """The Outcome of a pod the API server returned (created, or a server-side dry run)."""
    spec = pods.spec(pod)
    status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    return Outcome(
        name=pods.display_name(pod), namespace=namespace,
        policy=pods.annotations_of(pod).get(names.POLICY_ANNOTATION),
        gpus=tuple(sorted(demand.gpu_requests(pod).items())),
        node=spec.get("nodeName") or None, phase=(status or {}).get("phase"),
    )


def refused(name: str, *, namespace: str, message: str) -> Outcome:
    """The Outcome of a pod the API server refused with ``message``."""
    return Outcome(name=name, namespace=namespace, denied=message)


def denial_text(body: str) -> str:
    """The message of a refused create: a Status object's ``message``, else the body as it came."""
    try:
        status = json.loads(body)
    except ValueError:
        return body.strip()
    message = status.get("message") if isinstance(status, dict) else None
    return message.strip() if isinstance(message, str) else body.strip()


WEBHOOK_NAMES: tuple[str, ...] = ("mutate.gpugate.io", "validate.gpugate.io")
"""The webhooks of manifests/webhook/webhookconfigurations.yaml (and the chart's)."""


def by_gpugate(message: str) -> bool:
    """Whether a refusal came from gpugate's webhooks (the API server names the webhook that denied),
    not from RBAC, a quota or another admission plugin."""
    return any(f'admission webhook "{name}" denied the request' in message for name in WEBHOOK_NAMES)


def table(rows: list[tuple[str, Outcome]]) -> str:
    """A fixed-width table, one line per pod: what it asked (``rows``' label), what it became, where it is.

    Denied pods say so with the API server's message in the last column, which is never cut: it is
    the part a person reads.
    """
    header = ("POD", "NAMESPACE", "ASKED", "POLICY", "BECAME", "NODE")
    lines = [header]
    for label, pod in rows:
        if pod.denied is not None:
            lines.append((pod.name, pod.namespace, label, "-", "DENIED", pod.denied))
        else:
            where = pod.node or f"(not scheduled: {pod.phase or 'Pending'})"
            lines.append((pod.name, pod.namespace, label, pod.policy or "-", pod.asks(), where))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False)) + "  " + line[-1]
                     for line in lines)
