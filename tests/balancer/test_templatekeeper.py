"""The balancer keeps the ResourceClaimTemplates right-sized pods name.

The pods are the webhook's own output (``mutation.mutate`` under a ``through: dra`` policy), stored
in tests/kubefake.py; the balancer runs with the real client. A pending pod gets its template made in
its namespace, once for all pods with the same ask; a pod whose annotation is not the template its
label names gets nothing (and the balancer goes on); a standby (dry run) writes nothing.
"""

from __future__ import annotations

import json
import time

from tests.admission.test_claimladder import POLICIES, asking
from tests.balancer.conftest import fast_settings, wait_for
from tests.balancer.test_dra import serve_dra
from tests.kubefake import FakeKube
from webhook import names
from webhook.admission import mutation

TEMPLATE = ("resource.k8s.io/v1", "ResourceClaimTemplate")


def right_sized(name: str, memory: str, namespace: str = "ml-a", *, phase: str = "Pending") -> dict:
    made = mutation.mutate(asking(memory), namespace=namespace, policies=POLICIES)
    pod = json.loads(json.dumps(made.desired))
    pod["metadata"].update(name=name, namespace=namespace)
    pod["status"] = {"phase": phase}
    return pod


def templates(fk: FakeKube, namespace: str) -> dict[str, dict]:
    return {t["metadata"]["name"]: t for t in fk.list(*TEMPLATE, namespace=namespace)}


def test_pending_pods_get_their_template_once_per_namespace_and_ask(fake_kube: FakeKube, start_balancer) -> None:
    serve_dra(fake_kube)
    for pod in (right_sized("a", "20Gi"), right_sized("b", "20Gi"), right_sized("c", "50Gi"),
                right_sized("d", "20Gi", namespace="ml-b"), right_sized("done", "30Gi", phase="Running")):
        fake_kube.put(pod)
    running = start_balancer(fast_settings())
    wanted = {right_sized("a", "20Gi")["metadata"]["labels"][names.CLAIM_TEMPLATE_LABEL],
              right_sized("c", "50Gi")["metadata"]["labels"][names.CLAIM_TEMPLATE_LABEL]}
    wait_for(lambda: set(templates(fake_kube, "ml-a")) == wanted, what="the two templates of ml-a")
    wait_for(lambda: len(templates(fake_kube, "ml-b")) == 1, what="the template of ml-b")
    made = templates(fake_kube, "ml-a")
    first = made[min(wanted)]
    assert first["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert first["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpugate"
    # The running pod's 30Gi template is not made: only pending pods wait for one.
    assert len(made) == 2
    # A new pending pod with a known ask makes nothing new; one with a new ask does.
    fake_kube.put(right_sized("e", "20Gi"))
    fake_kube.put(right_sized("f", "70Gi"))
    wait_for(lambda: len(templates(fake_kube, "ml-a")) == 3, what="the 70Gi template")
    assert running.balancer.templates.created == 4


def test_a_tampered_annotation_makes_nothing(fake_kube: FakeKube, start_balancer) -> None:
    serve_dra(fake_kube)
    pod = right_sized("t", "20Gi")
    document = json.loads(pod["metadata"]["annotations"][names.CLAIM_TEMPLATE_ANNOTATION])
    document["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["deviceClassName"] = "x.example.com"
    pod["metadata"]["annotations"][names.CLAIM_TEMPLATE_ANNOTATION] = json.dumps(document)
    fake_kube.put(pod)
    fake_kube.put(right_sized("good", "50Gi"))
    start_balancer(fast_settings())
    wait_for(lambda: len(templates(fake_kube, "ml-a")) == 1, what="the good pod's template")
    time.sleep(0.3)
    (only,) = templates(fake_kube, "ml-a").values()
    assert only["metadata"]["name"] == right_sized("good", "50Gi")["metadata"]["labels"][names.CLAIM_TEMPLATE_LABEL]


def test_a_dry_run_replica_writes_no_template(fake_kube: FakeKube, start_balancer) -> None:
    serve_dra(fake_kube)
    fake_kube.put(right_sized("a", "20Gi"))
    running = start_balancer(fast_settings(dry_run=True))
    wait_for(lambda: running.balancer.templates.informer.synced.is_set(), what="the pod informer synced")
    time.sleep(0.5)
    assert templates(fake_kube, "ml-a") == {}
