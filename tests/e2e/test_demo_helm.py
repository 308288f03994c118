"""``gpugate demo --install helm``'s install, on the e2e control plane with the built helm: the chart
installed as a user would onto the demo's cluster (its namespaces made, nothing else of gpugate
registered), its webhook pointed at a local ``gpugate serve``, shapes a GPU pod and refuses a web
one. Before, ``helm install`` onto the demo's cluster failed on the configurations the demo had
registered, and the working way (external TLS mode) was written only in a values file under ci/."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import helmtool
from tests.e2e import webhook_fixture as fixture
from tests.e2e.test_gpugate_chart import _forget_unowned_cluster_objects
from tests.server.harness import copy_policies
from webhook.localcluster import demo
from webhook.localcluster.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(local: Cluster, workdir: Path) -> Iterator[fixture.GpugateServer]:
    assert local.plane is not None
    helm = helmtool.helm_binary()
    certs = fixture.ServingCerts(workdir / "certs")
    running = fixture.GpugateServer(cert=certs.cert, key=certs.key, ca=certs.ca,
                                    policies=copy_policies(workdir / "policies"),
                                    log=local.plane.logs / "gpugate-demo-helm.log")
    _forget_unowned_cluster_objects(local)
    lines: list[str] = []
    with fixture.serving(running):
        demo.install_chart(local.kubeconfig, helm, ROOT / "manifests" / "chart" / "gpugate", running.base_url,
                           certs.bundle.ca_cert, workdir, lines.append)
        assert lines and lines[0].startswith("helm install gpugate ")
        try:
            yield running
        finally:
            release, namespace = demo.CHART_RELEASE
            subprocess.run([str(helm), "uninstall", release, "--namespace", namespace, "--kubeconfig",
                            str(local.kubeconfig), "--wait", "--timeout", "120s"], capture_output=True, check=False)


def test_the_charts_webhook_shapes_a_gpu_pod_and_refuses_a_web_one(local: Cluster,
                                                                    installed: fixture.GpugateServer) -> None:
    made = fixture.Namespaces(local)
    try:
        ml, web = made.make("ml-team"), made.make("web-shop")
        core = local.core()
        shaped = fixture.create_pod(core, ml, fixture.pod_manifest("probe", labels={"gpugate.io/profile": "training",
                                                                     "gpugate.io/gpus": "2"}), dry_run=True)
        assert (fixture.policy_of(shaped) or "").startswith("training@")
        assert shaped["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
        from kubernetes.client.rest import ApiException

        with pytest.raises(ApiException) as refused:
            fixture.create_pod(core, web, fixture.pod_manifest("probe", gpus=1), dry_run=True)
        assert "GPUs are not available in web and frontend namespaces" in str(refused.value.body)
    finally:
        made.delete_all()
