"""Build a real ``kubernetes`` ApiClient for an edge that talks to the cluster.

Every edge (balancer, certs installer, stack status) gets its client here so the choice
between an explicit server URL (tests, port-forwards), in-cluster service account and
kubeconfig is made once, the same way everywhere.
"""

from __future__ import annotations

from kubernetes import client, config


def api_client(server: str | None = None, *, token: str | None = None) -> client.ApiClient:
    """Return an ApiClient for ``server`` if given, else in-cluster, else the kubeconfig.

    An explicit ``server`` is used as is, without credentials unless ``token`` is given:
    that is what a test against a local fake API server needs.
    """
    if server:
        configuration = client.Configuration()
        configuration.host = server.rstrip("/")
        if token:
            configuration.api_key = {"authorization": f"Bearer {token}"}
        if server.startswith("http://"):
            configuration.verify_ssl = False
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()
