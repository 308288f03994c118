"""The fake API server answers the real ``kubernetes`` client the way the apiserver does."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import Watch

from tests.kubefake import JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, FakeKube
from webhook.kubeclient import api_client


def node(name: str, labels: dict | None = None, taints: list | None = None) -> dict:
    body: dict = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
                  "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    if taints is not None:
        body["spec"] = {"taints": taints}
    return body


def pod(name: str, namespace: str = "ml", node_name: str = "", labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"nodeName": node_name, "containers": [{"name": "main", "image": "busybox"}]}}


@pytest.fixture
def core(fake_kube: FakeKube) -> client.CoreV1Api:
    return client.CoreV1Api(api_client(fake_kube.url))


def test_list_returns_items_and_the_current_resource_version(fake_kube: FakeKube, core) -> None:
    fake_kube.put(node("gpu-1"))
    fake_kube.put(node("gpu-2"))
    result = core.list_node()
    assert [n.metadata.name for n in result.items] == ["gpu-1", "gpu-2"]
    assert result.metadata.resource_version == str(fake_kube.resource_version)
    assert result.items[0].status.allocatable == {"nvidia.com/gpu": "8"}


def test_list_pages_with_limit_and_continue(fake_kube: FakeKube, core) -> None:
    fake_kube.put_many(pod(f"p{i:03}") for i in range(25))
    names, token, pages = [], None, 0
    while True:
        page = core.list_pod_for_all_namespaces(limit=10, _continue=token)
        names += [p.metadata.name for p in page.items]
        pages += 1
        token = page.metadata._continue
        if not token:
            break
    assert pages == 3 and names == [f"p{i:03}" for i in range(25)]


def test_label_and_field_selectors_filter_lists(fake_kube: FakeKube, core) -> None:
    fake_kube.put(pod("a", labels={"app": "x"}, node_name="n1"))
    fake_kube.put(pod("b", labels={"app": "y"}))
    fake_kube.put(pod("c", namespace="other", labels={"app": "x"}, node_name="n1"))
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(label_selector="app=x").items] == ["a", "c"]
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(label_selector="app in (y)").items] == ["b"]
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=").items] \
        == ["a", "c"]
    assert [p.metadata.name for p in core.list_namespaced_pod("ml", label_selector="app!=y").items] == ["a"]


def test_watch_streams_events_after_the_listed_resource_version(fake_kube: FakeKube, core) -> None:
    fake_kube.put(node("gpu-1"))
    rv = core.list_node().metadata.resource_version
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def watch() -> None:
        for event in Watch().stream(core.list_node, resource_version=rv, timeout_seconds=5):
            seen.append((event["type"], event["object"].metadata.name))
            if len(seen) == 3:
                done.set()
                break

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    fake_kube.put(node("gpu-2"))
    fake_kube.put(node("gpu-1", labels={"x": "1"}))
    fake_kube.delete("v1", "Node", "gpu-2")
    assert done.wait(5)
    assert seen == [("ADDED", "gpu-2"), ("MODIFIED", "gpu-1"), ("DELETED", "gpu-2")]


def test_watch_without_resource_version_starts_with_added_events(fake_kube: FakeKube, core) -> None:
    fake_kube.put(node("gpu-1"))
    events = list(Watch().stream(core.list_node, timeout_seconds=1))
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "gpu-1")]


def test_watch_reports_objects_leaving_a_field_selector_as_deleted(fake_kube: FakeKube, core) -> None:
    fake_kube.put(pod("a", node_name="n1"))
    rv = core.list_pod_for_all_namespaces().metadata.resource_version
    fake_kube.put(pod("a", node_name=""))  # unbound: leaves spec.nodeName!=
    resp = core.list_pod_for_all_namespaces(watch=True, resource_version=rv, field_selector="spec.nodeName!=",
                                            timeout_seconds=1, _preload_content=False)
    lines = [json.loads(line) for line in resp.read().splitlines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("DELETED", "a")]


def test_expired_watch_ends_with_a_410_error_event(fake_kube: FakeKube, core) -> None:
    rv = core.list_node().metadata.resource_version
    fake_kube.expire_watches()
    with pytest.raises(ApiException) as err:
        list(Watch().stream(core.list_node, resource_version=rv, timeout_seconds=2))
    assert err.value.status == 410


def test_open_watch_is_ended_by_expire_watches(fake_kube: FakeKube, core) -> None:
    rv = core.list_node().metadata.resource_version
    result: list[object] = []

    def watch() -> None:
        resp = core.list_node(watch=True, resource_version=rv, timeout_seconds=10, _preload_content=False)
        result.extend(json.loads(line) for line in resp.read().splitlines() if line)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    for _ in range(100):
        if fake_kube.open_watches("nodes"):
            break
        threading.Event().wait(0.02)
    fake_kube.expire_watches()
    thread.join(5)
    assert result and result[-1]["type"] == "ERROR" and result[-1]["object"]["code"] == 410


def test_patch_node_sends_strategic_merge_for_a_dict_and_keeps_other_labels(fake_kube: FakeKube, core) -> None:
    fake_kube.put(node("gpu-1", labels={"keep": "me", "drop": "x"},
                       taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]))
    core.patch_node("gpu-1", {"metadata": {"labels": {"new": "1", "drop": None}},
                              "spec": {"taints": [{"key": "a", "effect": "PreferNoSchedule"}]}})
    method, path, content_type, body = fake_kube.requests[-1]
    assert (method, path, content_type) == ("PATCH", "/api/v1/nodes/gpu-1", STRATEGIC_PATCH)
    stored = fake_kube.get("v1", "Node", "gpu-1")
    assert stored["metadata"]["labels"] == {"keep": "me", "new": "1"}
    # Node taints carry no merge key: the list is replaced as a whole.
    assert stored["spec"]["taints"] == [{"key": "a", "effect": "PreferNoSchedule"}]


def test_patch_accepts_json_patch_and_merge_patch(fake_kube: FakeKube, core) -> None:
    fake_kube.put(node("gpu-1", labels={"a": "1"}))
    core.patch_node("gpu-1", [{"op": "add", "path": "/metadata/labels/b", "value": "2"}])
    assert fake_kube.requests[-1].content_type == JSON_PATCH
    # Not every supported client version can force a content type: send this one by hand.
    request = urllib.request.Request(f"{fake_kube.url}/api/v1/nodes/gpu-1", method="PATCH",
                                     data=json.dumps({"metadata": {"labels": {"a": None}}}).encode(),
                                     headers={"Content-Type": MERGE_PATCH})
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5).read()
    assert fake_kube.requests[-1].content_type == MERGE_PATCH
    assert fake_kube.get("v1", "Node", "gpu-1")["metadata"]["labels"] == {"b": "2"}


def test_strategic_merge_merges_containers_by_name(fake_kube: FakeKube, core) -> None:
    body = pod("a")
    body["spec"]["containers"].append({"name": "side", "image": "x"})
    fake_kube.put(body)
    core.patch_namespaced_pod("a", "ml", {"spec": {"containers": [{"name": "side", "image": "y"}]}})
    containers = fake_kube.get("v1", "Pod", "a", "ml")["spec"]["containers"]
    assert [(c["name"], c["image"]) for c in containers] == [("main", "busybox"), ("side", "y")]


def test_patch_with_stale_resource_version_conflicts(fake_kube: FakeKube, core) -> None:
    stored = fake_kube.put(node("gpu-1"))
    fake_kube.put(node("gpu-1", labels={"changed": "yes"}))
    with pytest.raises(ApiException) as err:
        core.patch_node("gpu-1", {"metadata": {"resourceVersion": stored["metadata"]["resourceVersion"],
                                               "labels": {"x": "1"}}})
    assert err.value.status == 409


def test_create_then_replace_with_stale_version_is_409(fake_kube: FakeKube) -> None:
    coord = client.CoordinationV1Api(api_client(fake_kube.url))
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "l", "namespace": "ns"}, "spec": {"holderIdentity": "a"}}
    created = coord.create_namespaced_lease("ns", lease)
    assert created.metadata.resource_version and created.metadata.uid
    with pytest.raises(ApiException) as dup:
        coord.create_namespaced_lease("ns", lease)
    assert dup.value.status == 409
    fresh = dict(lease, metadata={"name": "l", "namespace": "ns",
                                  "resourceVersion": created.metadata.resource_version},
                 spec={"holderIdentity": "b"})
    replaced = coord.replace_namespaced_lease("l", "ns", fresh)
    assert replaced.spec.holder_identity == "b"
    with pytest.raises(ApiException) as stale:
        coord.replace_namespaced_lease("l", "ns", dict(fresh, spec={"holderIdentity": "c"}))
    assert stale.value.status == 409
    assert replaced.metadata.uid == created.metadata.uid


def test_missing_object_is_404_and_delete_emits_deleted(fake_kube: FakeKube, core) -> None:
    with pytest.raises(ApiException) as err:
        core.read_node("nope")
    assert err.value.status == 404 and json.loads(err.value.body)["reason"] == "NotFound"
    fake_kube.put(node("gpu-1"))
    core.delete_node("gpu-1")
    assert fake_kube.get("v1", "Node", "gpu-1") is None


def test_generate_name_and_dry_run(fake_kube: FakeKube, core) -> None:
    body = pod("")
    body["metadata"] = {"generateName": "job-", "namespace": "ml"}
    made = core.create_namespaced_pod("ml", body)
    assert made.metadata.name.startswith("job-") and len(made.metadata.name) > 4
    core.create_namespaced_pod("ml", pod("dry"), dry_run="All")
    assert fake_kube.get("v1", "Pod", "dry", "ml") is None


def test_unknown_patch_content_type_is_415(fake_kube: FakeKube) -> None:
    fake_kube.put(node("gpu-1"))
    request = urllib.request.Request(f"{fake_kube.url}/api/v1/nodes/gpu-1", method="PATCH", data=b"{}",
                                     headers={"Content-Type": "application/apply-patch+yaml"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5)
    assert err.value.code == 415


def test_injected_faults_answer_with_the_status_asked(fake_kube: FakeKube, core) -> None:
    fake_kube.fail_next("GET", r"^/api/v1/nodes$", 500)
    with pytest.raises(ApiException) as err:
        core.list_node()
    assert err.value.status == 500
    assert core.list_node().items == []


def test_custom_kinds_are_served_after_register(fake_kube: FakeKube) -> None:
    fake_kube.register("example.com", "v1", "Widget", "widgets", True)
    fake_kube.put({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "d"}})
    custom = client.CustomObjectsApi(api_client(fake_kube.url))
    got = custom.get_namespaced_custom_object("example.com", "v1", "d", "widgets", "w")
    assert got["metadata"]["name"] == "w"
    custom.patch_namespaced_custom_object("example.com", "v1", "d", "widgets", "w", {"spec": {"size": 2}})
    assert fake_kube.get("example.com/v1", "Widget", "w", "d")["spec"] == {"size": 2}


# ---- what the balancer's tests need from the fake ---------------------------------
def watch_lines(fk: FakeKube, path: str, **query: str) -> list[dict]:
    """Every line of one watch on ``path`` with ``query``, read until the server ends it."""
    from urllib.parse import urlencode
    request = urllib.request.Request(f"{fk.url}{path}?{urlencode({'watch': 'true', **query})}")
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as response:
        return [json.loads(line) for line in response.read().splitlines() if line.strip()]


def test_watches_that_allow_bookmarks_get_them_with_the_current_revision(core) -> None:
    fk = FakeKube(bookmark_interval=0.3).start()
    try:
        fk.put(node("gpu-1"))
        rv = client.CoreV1Api(api_client(fk.url)).list_node().metadata.resource_version
        fk.put(pod("p", node_name="gpu-1"))  # pods change, nodes do not
        lines = watch_lines(fk, "/api/v1/nodes", resourceVersion=rv, allowWatchBookmarks="true",
                            timeoutSeconds="1")
        assert lines and all(e["type"] == "BOOKMARK" for e in lines)
        assert len(lines) >= 3  # every 0.3 s, and one as the watch times out
        assert lines[-1]["object"]["metadata"]["resourceVersion"] == str(fk.resource_version) != rv
        assert lines[-1]["object"]["kind"] == "Node"
        assert all(e["type"] != "BOOKMARK" for e in watch_lines(fk, "/api/v1/nodes", resourceVersion=rv,
                                                                 timeoutSeconds="1"))
    finally:
        fk.stop()


def test_a_patch_that_changes_nothing_is_no_write(fake_kube: FakeKube, core) -> None:
    stored = fake_kube.put(node("gpu-1", labels={"a": "1"}))
    rv = stored["metadata"]["resourceVersion"]
    core.patch_node("gpu-1", {"metadata": {"labels": {"a": "1"}}})
    replaced = core.replace_node("gpu-1", core.read_node("gpu-1"))
    assert replaced.metadata.resource_version == rv
    assert fake_kube.get("v1", "Node", "gpu-1")["metadata"]["resourceVersion"] == rv
    lines = watch_lines(fake_kube, "/api/v1/nodes", resourceVersion=str(int(rv) - 1), timeoutSeconds="1")
    assert [e["type"] for e in lines] == ["ADDED"]  # the put only: no MODIFIED for the no-ops
    core.patch_node("gpu-1", {"metadata": {"labels": {"a": "2"}}})
    assert fake_kube.get("v1", "Node", "gpu-1")["metadata"]["resourceVersion"] != rv


def test_a_bound_pod_is_deleted_gracefully_and_finalizers_hold_deletion(fake_kube: FakeKube, core) -> None:
    bound = pod("bound", node_name="gpu-1")
    bound["spec"]["terminationGracePeriodSeconds"] = 45
    fake_kube.put(bound)
    fake_kube.put(pod("unbound"))
    core.delete_namespaced_pod("unbound", "ml")
    assert fake_kube.get("v1", "Pod", "unbound", "ml") is None     # nothing runs it: gone at once
    core.delete_namespaced_pod("bound", "ml")
    terminating = fake_kube.get("v1", "Pod", "bound", "ml")
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 45
    assert terminating["metadata"]["deletionTimestamp"]
    core.patch_namespaced_pod("bound", "ml", {"metadata": {"labels": {"x": "1"}}})  # still there, still writable
    assert fake_kube.get("v1", "Pod", "bound", "ml")["metadata"]["deletionGracePeriodSeconds"] == 45
    core.delete_namespaced_pod("bound", "ml", grace_period_seconds=0)  # the kubelet confirms
    assert fake_kube.get("v1", "Pod", "bound", "ml") is None
    held = node("gpu-9")
    held["metadata"]["finalizers"] = ["example.com/keep"]
    fake_kube.put(held)
    core.delete_node("gpu-9")
    assert fake_kube.get("v1", "Node", "gpu-9")["metadata"]["deletionTimestamp"]
    core.patch_node("gpu-9", {"metadata": {"finalizers": None}})
    assert fake_kube.get("v1", "Node", "gpu-9") is None


def test_a_429_carries_retry_after_as_header_and_status(fake_kube: FakeKube, core) -> None:
    fake_kube.put(node("gpu-1"))
    fake_kube.fail_next("PATCH", r"^/api/v1/nodes/gpu-1$", 429, retry_after=3, reason="TooManyRequests",
                        message="too many requests, please try again later")
    with pytest.raises(ApiException) as err:
        core.patch_node("gpu-1", {"metadata": {"labels": {"a": "1"}}})
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "3"
    assert json.loads(err.value.body)["details"]["retryAfterSeconds"] == 3
    assert fake_kube.requests[-1].status == 429


def test_faults_match_query_and_user_agent_and_delays_hold_requests(fake_kube: FakeKube) -> None:
    api = api_client(fake_kube.url)
    api.user_agent = "gpugate-balancer (replica-a)"
    core = client.CoreV1Api(api)
    fake_kube.fail_next("GET", r"^/api/v1/nodes$", 410, query={"watch": "true", "resourceVersion": "*"},
                        user_agent="replica-a")
    assert core.list_node().items == []  # not a watch: not matched
    with pytest.raises(ApiException) as err:
        core.list_node(watch=True, resource_version="1", _preload_content=False)
    assert err.value.status == 410
    fake_kube.delay("GET", r"^/api/v1/nodes$", 0.3, count=1)
    started = time.monotonic()
    core.list_node()
    assert time.monotonic() - started >= 0.3
    assert fake_kube.requests[-1].user_agent == "gpugate-balancer (replica-a)"
    assert fake_kube.requests[-1].at - started >= 0.3


def test_a_streaming_list_sends_every_object_then_the_initial_events_end_bookmark(core) -> None:
    fk = FakeKube(bookmark_interval=60).start()
    try:
        fk.put(node("gpu-1"))
        fk.put(node("gpu-2"))
        lines = watch_lines(fk, "/api/v1/nodes", sendInitialEvents="true", resourceVersionMatch="NotOlderThan",
                            allowWatchBookmarks="true", timeoutSeconds="1")
        assert [(e["type"], e["object"]["metadata"].get("name")) for e in lines[:2]] == \
            [("ADDED", "gpu-1"), ("ADDED", "gpu-2")]
        end = lines[2]
        assert end["type"] == "BOOKMARK"
        assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
        assert end["object"]["metadata"]["resourceVersion"] == str(fk.resource_version)
    finally:
        fk.stop()
    old = FakeKube(watch_list=False).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            watch_lines(old, "/api/v1/nodes", sendInitialEvents="true", resourceVersionMatch="NotOlderThan",
                        allowWatchBookmarks="true")
        assert err.value.code == 422
    finally:
        old.stop()
