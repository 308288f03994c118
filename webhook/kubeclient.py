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
from webhook.kubetarget import Target

T = TypeVar("T")
__all__ = ["Target", "api_client", "call", "call_unless_absent", "failure", "missing_namespace", "raw_json",
           "body", "status_of"]

NO_CLUSTER = ("no cluster to talk to ({reason}): pass --kubeconfig FILE (and --context NAME) or --server URL, "
              "run in a pod with a service account, or set KUBECONFIG")


def api_client(server: str | Target | None = None, *, token: str | None = None,
               ca_file: str | None = None) -> client.ApiClient:
    """Return an ApiClient for ``server`` (a URL or a ``Target``) if given, else in-cluster, else the kubeconfig.

    An explicit server URL is used as is, without credentials unless ``token`` is given:
    that is what a test against a local fake API server needs. ``ca_file`` is the CA bundle
    that signed an https server's certificate (else the system's trust store). A kubeconfig or
    context named on the command line is used as named, never the in-cluster account. Raises
    GpugateError naming the ways to point gpugate at a cluster when none is configured.
    """
    target = server if isinstance(server, Target) else Target(server=server)
    server = target.server
    if target.kubeconfig or target.context:
        configuration = client.Configuration()
        try:
            config.load_kube_config(config_file=target.kubeconfig, context=target.context,
                                    client_configuration=configuration)
        except (config.ConfigException, OSError) as err:
            raise GpugateError(f"cannot use {target.describe()}: {str(err).strip() or type(err).__name__}") from err
        except (TypeError, ValueError, AttributeError, KeyError) as err:  # the client's parse of a non-kubeconfig
            raise GpugateError(f"cannot use {target.describe()}: it is not a kubeconfig ({type(err).__name__})") \
                from err
        return client.ApiClient(configuration)
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


def failure(err: BaseException) -> str:
    """One failed API call in a sentence, its cause first, whole (never the response's headers).

    The ``kubernetes`` client's own ``str()`` of an ApiException leads with the status line and
    the HTTP headers, and urllib3's buries "Connection refused" behind the URL and a retry count:
    a log line cut at a few hundred characters lost the cause in both.
    """
    if isinstance(err, ApiException):
        status = status_of(err)
        message = str(status.get("message") or "").strip()
        reason = status.get("reason") or err.reason or ""
        namespace = missing_namespace(err)
        if namespace:
            return f"namespace {namespace} does not exist (the API server answered {err.status} {reason}: {message})"
        return f"the API server answered {err.status} {reason}{': ' + message if message else ''}"
    refused = _refused(err)
    if refused is not None:
        return f"connection refused at {refused}: nothing listens there; check --server or KUBECONFIG and " \
               "that the API server is up"
    if isinstance(err, (urllib3.exceptions.HTTPError, OSError)):
        cause = getattr(err, "reason", None) or err
        return f"the API server does not answer ({cause}); check --server or KUBECONFIG and that the cluster is up"
    return f"{type(err).__name__}: {err}"


def missing_namespace(err: BaseException) -> str | None:
    """The namespace an ApiException says does not exist (the apiserver's NamespaceLifecycle
    refusal of a create: 404, ``details.kind`` ``namespaces``), else None."""
    if not isinstance(err, ApiException) or err.status != 404:
        return None
    details = status_of(err).get("details") or {}
    name = details.get("name") if isinstance(details, dict) else None
    return str(name) if details.get("kind") == "namespaces" and name else None


def status_of(err: ApiException) -> dict[str, Any]:
    """The Status object an ApiException carries (empty when the body is not one)."""
    try:
        body = json.loads(err.body or "{}")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _refused(err: BaseException) -> str | None:
    """``host:port`` (or "the API server") when ``err`` comes from a refused TCP connection, else None.

    urllib3 wraps the socket's ConnectionRefusedError in a NewConnectionError, held as the
    ``reason`` of the MaxRetryError the client raises; the pool on that one names the address.
    """
    where = "the API server"
    seen: BaseException | None = err
    for _ in range(8):  # a short chain; a cycle must not hang the error path
        if seen is None:
            return None
        pool = seen.pool if isinstance(seen, urllib3.exceptions.MaxRetryError) else None
        if pool is not None and pool.host:
            where = f"{pool.host}:{pool.port}"
        if isinstance(seen, ConnectionRefusedError) or (
                isinstance(seen, urllib3.exceptions.NewConnectionError) and "refused" in str(seen).lower()):
            return where
        reason = getattr(seen, "reason", None)
        seen = reason if isinstance(reason, BaseException) else (seen.__cause__ or seen.__context__)
    return None


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
