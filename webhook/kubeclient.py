"""Build a real ``kubernetes`` ApiClient for an edge that talks to the cluster, and read its answers.

Every edge (balancer, certs installer, stack status) gets its client here so the choice
between an explicit server URL (tests, port-forwards), in-cluster service account and
kubeconfig is made once, the same way everywhere, and so is the message when there is no
cluster to talk to or it does not answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3.exceptions
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from webhook.errors import ClusterAPIError, GpugateError

T = TypeVar("T")

NO_CLUSTER = ("no cluster to talk to ({reason}): pass --server URL, run in a pod with a service account, "
              "or set KUBECONFIG")


def api_client(server: str | None = None, *, token: str | None = None,
               ca_file: str | None = None) -> client.ApiClient:
    """Return an ApiClient for ``server`` if given, else in-cluster, else the kubeconfig.

    An explicit ``server`` is used as is, without credentials unless ``token`` is given:
    that is what a test against a local fake API server needs. ``ca_file`` is the CA bundle
    that signed an https server's certificate (else the system's trust store). Raises
    GpugateError naming the ways to point gpugate at a cluster when none is configured.
    """
    if server:
        configuration = client.Configuration()
        configuration.host = server.rstrip("/")
        if token:
            configuration.api_key = {"authorization": f"Bearer {token}"}
        if ca_file:
            configuration.ssl_ca_cert = ca_file
        if server.startswith("http://"):
            configuration.verify_ssl = False
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as err:
            raise GpugateError(NO_CLUSTER.format(reason=str(err).strip() or type(err).__name__)) from err
    return client.ApiClient()


def call(fn: Callable[[], T], what: str) -> T:
    """Run one API call; a refusal or an unreachable server becomes a ClusterAPIError naming ``what``."""
    try:
        return fn()
    except ApiException as err:
        reason = err.reason or ""
        try:
            reason = json.loads(err.body or "{}").get("message") or reason
        except (ValueError, AttributeError):
            pass
        raise ClusterAPIError(f"{what}: the API server answered {err.status} {reason}".rstrip()) from err
    except (urllib3.exceptions.HTTPError, OSError) as err:
        cause = getattr(err, "reason", None) or err
        raise ClusterAPIError(f"{what}: the API server does not answer ({cause}); check --server or "
                              f"KUBECONFIG and that the cluster is up") from err


def call_unless_absent(fn: Callable[[], T], what: str) -> T | None:
    """``call``, but None when the API answers 404: the resource type is not served (its CRD is not installed)."""
    try:
        return call(fn, what)
    except ClusterAPIError as err:
        if isinstance(err.__cause__, ApiException) and err.__cause__.status == 404:
            return None
        raise


def raw_json(response: Any) -> Any:
    """The JSON of a response fetched with ``_preload_content=False`` (the client's models drop fields)."""
    return json.loads(response.data)


def body(obj: dict[str, Any]) -> Any:
    """A plain dict as a request body: the client serializes dicts as they are (its stubs ask for models)."""
    return obj
