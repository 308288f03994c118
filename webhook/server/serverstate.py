"""The admission server's settings and what one app holds: the policy store, the inventory, the core.

Settings come from the caller (``gpugate serve``) or, for ``gunicorn 'webhook.server.routes:create_app()'``,
from ``GPUGATE_*`` variables read once in ``ServerSettings.from_env``. The policy core is passed in
(``Core``): the real one by default, a stub in the benchmark that measures what the server alone
costs. Whatever core is used, it answers with the typed results of ``admission.results``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from webhook import names
from webhook.admission.results import Mutation, Verdict
from webhook.errors import ClusterAPIError
from webhook.kube import claims, units
from webhook.kube import demand as kube_demand
from webhook.kube.claims import Claim
from webhook.kube.inventory import Inventory
from webhook.kube.pods import Pod
from webhook.policy import PolicySet
from webhook.policy.store import PolicyStore
from webhook.server.inventoryfile import InventoryFile

if TYPE_CHECKING:
    from webhook.admission import dra
    from webhook.server.claimlookup import ClaimLookup
    from webhook.server.podlookup import PodLookup

API_SERVER_INPUT_BYTES = 3 * 1024 * 1024
"""The most a client may send the API server for one object (its ``--max-request-body-bytes`` default)."""
ENCODED_BYTES_PER_INPUT_BYTE = 6
"""The API server re-encodes the object as JSON and writes ``<``, ``>``, ``&`` (and U+2028/9) as
``\u003c``: one input byte can become six in the review."""
MAX_BODY_BYTES = 2 * ENCODED_BYTES_PER_INPUT_BYTE * API_SERVER_INPUT_BYTES + 1024 * 1024
"""The largest review the API server can send: an object and an old object (an UPDATE), each at most
3 MiB of input re-encoded at six bytes per byte, plus 1 MiB for the request's other fields (userInfo,
options). A smaller limit would refuse a review the API server can send, and a refusal that is not an
answer (413) is a failed call: under failurePolicy Fail a 500 for the user, under Ignore a pod
admitted unjudged."""


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    policy_dir: Path = Path("policies")
    """The folder of GPUPolicy files; watched for changes."""
    fail_closed: bool = False
    """Mutation too denies what it cannot shape (an internal error, an unreadable pod) instead of
    admitting it unchanged. Off by default: mutation is defaulting, and validation judges the pod anyway."""
    fail_open: bool = False
    """Validation admits, with a warning, what it cannot judge (the behaviour before validation failed
    closed; for a validating webhook registered with failurePolicy: Ignore). Off by default: a review
    the server cannot judge is denied with the reason, or any tenant who can make the webhook fail
    (a huge or deeply nested object, a claim that cannot be read) gets past every policy."""
    reload_interval: float = 1.0
    """Seconds between two looks at the policy folder; 0 disables hot reload."""
    max_body_bytes: int = MAX_BODY_BYTES
    """The API server sends at most ~3 MiB objects (etcd's request limit); more is not a review."""
    allow_empty: bool = False
    """Serve a folder without any policy. Off: an emptied folder would silently lift every deny rule."""
    snapshot_dir: Path | None = None
    """Where the last accepted policy files are kept for sibling workers (gpugate serve sets it)."""
    inventory_file: Path | None = None
    """The balancer's GPUInventory (the gpugate-inventory ConfigMap, mounted); optional."""
    resolve_claims: bool = False
    """Read the ResourceClaims and ResourceClaimTemplates a pod references from the API (in-cluster
    service account or KUBECONFIG), so ``max`` per pod counts their devices. Off: the webhook has no
    API access, and a pod's claims are judged one by one when each is created."""

    def fails_closed(self, endpoint: str) -> bool:
        """Whether ``endpoint`` denies what it cannot judge: validation unless ``fail_open``, mutation
        only with ``fail_closed``."""
        return not self.fail_open if endpoint == "validate" else self.fail_closed

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ServerSettings:
        env = os.environ if environ is None else environ
        truthy = {"1", "true", "yes", "on"}
        snapshot = env.get("GPUGATE_POLICY_SNAPSHOT_DIR")
        inventory_file = env.get("GPUGATE_INVENTORY")
        return cls(
            policy_dir=Path(env.get("GPUGATE_POLICIES", "policies")),
            fail_closed=env.get("GPUGATE_FAIL_CLOSED", "").lower() in truthy,
            fail_open=env.get("GPUGATE_FAIL_OPEN", "").lower() in truthy,
            reload_interval=float(env.get("GPUGATE_RELOAD_INTERVAL", "1.0")),
            allow_empty=env.get("GPUGATE_ALLOW_EMPTY_POLICIES", "").lower() in truthy,
            snapshot_dir=Path(snapshot) if snapshot else None,
            inventory_file=Path(inventory_file) if inventory_file else None,
            resolve_claims=env.get("GPUGATE_RESOLVE_CLAIMS", "").lower() in truthy,
        )


class Core(Protocol):
    """The policy core the routes call for a pod: ``mutation.mutate`` and ``validation.validate``."""

    def mutate(self, pod: Pod, *, namespace: str, policies: PolicySet, inventory: Inventory,
               now: datetime) -> Mutation: ...

    def validate(self, pod: Pod, *, namespace: str, policies: PolicySet, inventory: Inventory,
                 now: datetime) -> Verdict: ...


class ClassSource(Protocol):
    """The cluster's DeviceClasses as last read (``deviceclasswatch.DeviceClassWatch``)."""

    def current(self) -> units.DeviceClasses: ...


class PolicyCore:
    """The real core, imported when the app is built (so a broken core still lets /healthz answer).

    ``classes``: where the cluster's DeviceClasses are read from (None: the NVIDIA chart's are
    assumed), so a pod asking a DRA extended-resource name is judged by the class serving it."""

    def __init__(self, classes: ClassSource | None = None) -> None:
        from webhook.admission import mutation, validation

        self._mutate, self._validate = mutation.mutate, validation.validate
        self._classes = classes

    def classes(self) -> units.DeviceClasses:
        return self._classes.current() if self._classes is not None else units.ASSUMED

    def mutate(self, pod: Pod, *, namespace: str, policies: PolicySet, inventory: Inventory,
               now: datetime) -> Mutation:
        return self._mutate(pod, namespace=namespace, policies=policies, inventory=inventory, now=now,
                            classes=self.classes())

    def validate(self, pod: Pod, *, namespace: str, policies: PolicySet, inventory: Inventory,
                 now: datetime) -> Verdict:
        return self._validate(pod, namespace=namespace, policies=policies, inventory=inventory, now=now,
                              classes=self.classes())


class ClaimCore:
    """The DRA half of the core (``admission.dra``): claims, templates and the pods that use them,
    with the reads that judge them together (the claims a pod names; the pods a claim serves)."""

    def __init__(self, lookup: ClaimLookup | None = None, classes: ClassSource | None = None,
                 pods: PodLookup | None = None) -> None:
        from webhook.admission import dra, mutation

        self._dra, self._mutation = dra, mutation
        self.lookup = lookup
        """A ``claimlookup.ClaimLookup`` when ``resolve_claims`` is on, else None."""
        self.pods = pods
        """A ``podlookup.PodLookup`` when ``resolve_claims`` is on, else None (a claim is judged alone)."""
        self._classes = classes

    def classes(self) -> units.DeviceClasses:
        return self._classes.current() if self._classes is not None else units.ASSUMED

    def resolved(self, pod: Pod, namespace: str) -> kube_demand.Resolved | None:
        """The claims and templates ``pod`` references, as the lookup read them; None when the lookup
        is off or the pod references none (the pod is then judged by the pod core alone)."""
        if self.lookup is None or not kube_demand.claim_refs(pod):
            return None
        return self.lookup.resolve(pod, namespace)

    def mutate_claim(self, claim: Claim, *, namespace: str, policies: PolicySet) -> Mutation:
        return self._dra.mutate_claim(claim, namespace=namespace, policies=policies, classes=self.classes())

    def validate_claim(self, claim: Claim, *, namespace: str, policies: PolicySet) -> Verdict:
        """The claim judged with the pods it serves, as read now; refused when they cannot be read.
        A claim that asks no GPU is let through without a read."""
        from webhook.policy import matching

        governed = matching.gpu_names(policies, self.classes()).governed
        if not any(a.device_class in governed for a in claims.parse(claim).asks()):
            return Verdict(allowed=True)
        try:
            context = self.context(claim, namespace)
        except ClusterAPIError as err:
            return Verdict(allowed=False, reasons=(
                f"{claim.get('kind')} '{claims.display_name(claim)}' in namespace '{namespace}': gpugate could not "
                f"read the pods it serves to judge it with them ({err}); try again",))
        return self._dra.validate_claim(claim, namespace=namespace, policies=policies, classes=self.classes(),
                                        context=context)

    def context(self, claim: Claim, namespace: str) -> dra.ClaimContext | None:
        """The owner pod and the pods that name the claim (with their claims), as read now; None
        without API access (the claim is then judged alone)."""
        if self.lookup is None or self.pods is None:
            return None
        from webhook.admission.dra import ClaimContext
        from webhook.kube import claimowners

        owner = owner_claims = None
        controller = claimowners.controlling_pod(claim)
        if controller is not None and claim.get("kind") == claims.CLAIM_KIND:
            owner = self.pods.get(namespace, controller[0])
            owner_claims = self.lookup.resolve(owner, namespace) if owner is not None else None
        name = str(pods_meta(claim).get("name") or "")
        naming: tuple[tuple[Pod, kube_demand.Resolved], ...] = ()
        if name and (claim.get("kind") == claims.CLAIM_KIND or name.startswith(names.RIGHTSIZED_TEMPLATE_PREFIX)):
            found = self.pods.naming(namespace, (str(claim.get("kind")), name))
            naming = tuple((p, self.lookup.resolve(p, namespace)) for p in found)
        return ClaimContext(owner=owner, owner_claims=owner_claims or {}, naming=naming)

    def mutate_pod(self, pod: Pod, *, namespace: str, policies: PolicySet, inventory: Inventory, now: datetime,
                   resolved: kube_demand.Resolved) -> Mutation:
        """A pod asking GPUs only through claims is shaped as a GPU pod (tolerations, placement terms)."""
        return self._mutation.mutate(pod, namespace=namespace, policies=policies, inventory=inventory, now=now,
                                     resolved=resolved, classes=self.classes())

    def add_pod_claims(self, verdict: Verdict, pod: Pod, *, namespace: str, policies: PolicySet,
                       resolved: kube_demand.Resolved) -> Verdict:
        """``verdict`` on the pod merged with the verdict on the claims it references: every reference
        read, none borrowed from kube-scheduler, deny rules and ``max`` per pod over everything."""
        return self._dra.merge(verdict, self._dra.validate_pod_claims(pod, namespace=namespace, policies=policies,
                                                                      resolved=resolved, classes=self.classes()))


def pods_meta(document: Claim) -> dict[str, Any]:
    meta = document.get("metadata")
    return meta if isinstance(meta, dict) else {}


@dataclass(frozen=True)
class ServerState:
    settings: ServerSettings
    store: PolicyStore
    core: Core
    inventory: InventoryFile
    claims: ClaimCore | None = None
