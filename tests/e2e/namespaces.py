"""A namespace shared by several test modules (gpugate-system): made by whichever needs it first.

Why a helper: deleting a namespace only starts it Terminating; the namespace controller removes
its content and then the namespace, and until then the API server refuses every new object in it
("unable to create new content in namespace ... because it is being terminated",
staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle). A module that deletes the
namespace and returns at once broke the next module that created its objects there (CI, test_inventory
after test_balancer). So: wait for a terminating namespace to be gone before making it, and wait
after deleting the one made here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kubernetes import client

from tests.e2e.waiting import wait_until

GONE_TIMEOUT = 120.0
"""Seconds a namespace may take to be deleted: the namespace controller's passes over every kind."""


def _phase(core: client.CoreV1Api, name: str) -> str | None:
    """The namespace's phase, None once it does not exist."""
    try:
        found = core.read_namespace(name)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return (found.status.phase if found.status else None) or "Active"


def wait_gone(core: client.CoreV1Api, name: str) -> None:
    wait_until(lambda: _phase(core, name) is None, timeout=GONE_TIMEOUT, interval=0.5,
               what=f"namespace {name} to be deleted")


@contextmanager
def shared_namespace(core: client.CoreV1Api, name: str) -> Iterator[bool]:
    """Make ``name`` if it is absent (or being deleted), yield whether it was made here, and
    delete it (and wait until it is gone) on exit if so."""
    if _phase(core, name) == "Terminating":
        wait_gone(core, name)
    created = False
    if _phase(core, name) is None:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        created = True
    try:
        yield created
    finally:
        if created:
            core.delete_namespace(name)
            wait_gone(core, name)


def has_default_account(core: client.CoreV1Api, namespace: str) -> bool:
    """The ServiceAccount admission plugin refuses pods until the controller manager made ``default``."""
    try:
        core.read_namespaced_service_account("default", namespace)
        return True
    except client.ApiException as error:
        if error.status != 404:
            raise
        return False
