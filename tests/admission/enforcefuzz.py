"""Mutated admission reviews against a served webhook, judged by an oracle written apart from the core.

No pytest here: ``benchmarks/fuzz_admission.py`` (the long run) and
``tests/admission/test_fuzz_enforcement.py`` (a short one) drive the same ``Fuzz``.

Each review starts from a seed pod (GPU asks in web namespaces, over the starter policies' ``max``,
a DeviceClass nobody knows, and pods the policies allow) and goes through one to four mutations a
hostile tenant could make or the API server could pass on: the GPU ask moved to another
container, split over several, put in an init container or a sidecar, spelled as a DRA
extended-resource name or as another quantity, requests and limits told apart, the opt-out label,
noise (``<`` characters, deep nesting, unknown fields, duplicate keys), a dry run, and random
damage anywhere in the document.

The oracle (``must_deny``) reads the mutated review with none of gpugate's code and says when no
starter policy may allow it: a CREATE of a Pod that names a GPU resource in a web or frontend
namespace, one that names ``deviceclass.resource.kubernetes.io/<class>`` of a class no one created,
or one whose regular containers and sidecars alone ask more than 8 whole GPUs in an ``ml-*``
namespace (training's max, the largest). A wrong allow is a 200 ``allowed: true`` from /validate
for such a review; every answer must also be a well-formed review for the request's uid, and none
a 5xx.
"""

from __future__ import annotations

import copy
import json
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Review = dict[str, Any]

GPU = "nvidia.com/gpu"
CLASS_NAME = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
WEB = ("web", "web-shop", "frontend", "frontend-a")
ML = ("ml-vision", "ml-x", "research-a")
KNOWN_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")
GPU_NAME = re.compile(r"^(nvidia\.com/(gpu|gpu\.shared|mig-[0-9]+g\.[0-9]+gb(\.[a-z0-9.-]+)?)"
                      r"|deviceclass\.resource\.kubernetes\.io/.+)$")
QUANTITIES = {1: ["1", "1000m", "+1", "1e0", " 1", "0.001k", 1],
              8: ["8", "8000m", "+8", "8e0", "08", "0.008k", 8], 9: ["9", "9000m", "+9", "9e0", 9]}
NOISE = ("<" * 2000, "<script>" * 50, "\u2028\u2029" * 100, "\x00" * 10, "é" * 500)


def pod(name: str, *containers: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"containers": list(containers)}}


def container(name: str, **limits: Any) -> dict[str, Any]:
    return {"name": name, "image": "registry.example/app:1",
            "resources": {"limits": {k.replace("__", "/").replace("_", "."): v for k, v in limits.items()}}}


def seeds() -> list[tuple[str, dict[str, Any]]]:
    """(namespace, pod): forbidden ones first, then ones the starter policies allow."""
    out: list[tuple[str, dict[str, Any]]] = []
    for ns in WEB:
        out.append((ns, pod("shop", container("shop", nvidia_com__gpu="1"))))
        out.append((ns, pod("shop", {"name": "shop", "image": "x", "resources": {"limits": {CLASS_NAME: "8"}}})))
        out.append((ns, pod("shop", {"name": "shop", "image": "x", "resources": {
            "limits": {"nvidia.com/mig-1g.10gb": "1"}}})))
        out.append((ns, pod("shop", {"name": "shop", "image": "x", "resources": {
            "limits": {"nvidia.com/gpu.shared": "1"}}})))
    for ns in ML:
        out.append((ns, pod("trainer", container("trainer", nvidia_com__gpu="9"),
                            labels={"gpugate.io/profile": "training"})))
        out.append((ns, pod("big", container("a", nvidia_com__gpu="5"), container("b", nvidia_com__gpu="5"))))
        out.append((ns, pod("accel", {"name": "a", "image": "x", "resources": {
            "limits": {"deviceclass.resource.kubernetes.io/accel.example.com": "1"}}})))
        out.append((ns, pod("ok", container("ok", nvidia_com__gpu="2"))))
        out.append((ns, pod("cpu", {"name": "c", "image": "x", "resources": {"limits": {"cpu": "1"}}})))
    return out


def review(namespace: str, obj: dict[str, Any]) -> Review:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "operation": "CREATE", "object": copy.deepcopy(obj), "oldObject": None, "dryRun": False}}


# --- the oracle: gpugate's code is not used ---------------------------------------------------------

def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _containers(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    spec = _dict(obj.get("spec"))
    out = [("init", c) for c in _list(spec.get("initContainers")) if isinstance(c, dict)]
    return out + [("app", c) for c in _list(spec.get("containers")) if isinstance(c, dict)]


def _zero(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool) and str(value).strip() in (
        "0", "0.0", "0m", "+0", "-0", "0e0")


def _asks(c: dict[str, Any]) -> dict[str, list[Any]]:
    """GPU-named keys of a container's requests and limits, with their values."""
    found: dict[str, list[Any]] = {}
    resources = _dict(c.get("resources"))
    for section in ("requests", "limits"):
        for key, value in _dict(resources.get(section)).items():
            if isinstance(key, str) and GPU_NAME.match(key):
                found.setdefault(key, []).append(value)
    return found


def _whole(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else None


def must_deny(doc: Any) -> bool:
    """No starter policy may allow this review's pod (see the module's docstring)."""
    request = _dict(_dict(doc).get("request"))
    kind = _dict(request.get("kind"))
    if (request.get("operation"), kind.get("group", ""), kind.get("kind"), request.get("subResource") or "") != (
            "CREATE", "", "Pod", ""):
        return False
    obj = _dict(request.get("object"))
    namespace = request.get("namespace") or _dict(obj.get("metadata")).get("namespace") or "default"
    if not isinstance(namespace, str):
        return False
    asks = [(where, key, values) for where, c in _containers(obj) for key, values in _asks(c).items()]
    named = [(where, key) for where, key, values in asks if not all(_zero(v) for v in values)]
    if named and (namespace in ("web", "frontend") or namespace.startswith(("web-", "frontend-"))):
        return True
    if any(key.startswith("deviceclass.resource.kubernetes.io/")
           and key.split("/", 1)[1] not in KNOWN_CLASSES for _, key in named):
        return True
    held = 0
    for where, c in _containers(obj):
        if where == "init" and c.get("restartPolicy") != "Always":
            continue
        resources = _dict(c.get("resources"))
        value = _dict(resources.get("requests")).get(GPU, _dict(resources.get("limits")).get(GPU))
        held += _whole(value) or 0
    return held > 8


# --- mutations ------------------------------------------------------------------------------------

Mutation = Callable[[random.Random, Review], None]


def _obj(doc: Review) -> dict[str, Any]:
    return _dict(_dict(doc.get("request")).get("object"))


def _gpu_limit(rng: random.Random, doc: Review) -> tuple[list[Any], dict[str, Any], str] | None:
    """A GPU key of some container's limits, with that ``limits`` and the pod's container list."""
    containers = _dict(_obj(doc).get("spec")).get("containers")
    found = [(_dict(_dict(c.get("resources")).get("limits")), key) for _, c in _containers(_obj(doc))
             for key in _asks(c)]
    if not found or not isinstance(containers, list):
        return None
    limits, key = rng.choice(found)
    return containers, limits, key


def move_to_another_container(rng: random.Random, doc: Review) -> None:
    hit = _gpu_limit(rng, doc)
    if hit is not None and hit[1].get(hit[2]) is not None:
        containers, limits, key = hit
        containers.append({"name": f"extra-{rng.randrange(99)}", "image": "x",
                           "resources": {"limits": {key: limits.pop(key)}}})


def split_over_containers(rng: random.Random, doc: Review) -> None:
    hit = _gpu_limit(rng, doc)
    count = _whole(hit[1].get(hit[2])) if hit is not None else None
    if hit is not None and count and count > 1:
        containers, limits, key = hit
        first = rng.randrange(1, count)
        limits[key] = str(first)
        containers.append({"name": f"half-{rng.randrange(99)}", "image": "x",
                           "resources": {"limits": {key: str(count - first)}}})


def into_init_container(rng: random.Random, doc: Review) -> None:
    hit = _gpu_limit(rng, doc)
    spec = _dict(_obj(doc).get("spec"))
    if hit is None:
        return
    _, limits, key = hit
    init = {"name": f"init-{rng.randrange(99)}", "image": "x", "resources": {"limits": {key: limits.get(key)}}}
    if rng.random() < 0.5:
        init["restartPolicy"] = "Always"
    inits = spec.setdefault("initContainers", [])
    if isinstance(inits, list):
        inits.append(init)


def spell_as_dra_name(rng: random.Random, doc: Review) -> None:
    for _, c in _containers(_obj(doc)):
        for section in ("requests", "limits"):
            values = _dict(_dict(c.get("resources")).get(section))
            if GPU in values and rng.random() < 0.7:
                values[CLASS_NAME] = values.pop(GPU)


def spell_the_quantity(rng: random.Random, doc: Review) -> None:
    for _, c in _containers(_obj(doc)):
        values = _dict(_dict(c.get("resources")).get("limits"))
        for key, value in list(values.items()):
            count = _whole(value)
            if isinstance(key, str) and GPU_NAME.match(key) and count in QUANTITIES:
                values[key] = rng.choice(QUANTITIES[count])


def requests_and_limits(rng: random.Random, doc: Review) -> None:
    found = [(c, key) for _, c in _containers(_obj(doc)) for key in _asks(c)]
    if not found:
        return
    c, key = rng.choice(found)
    resources = c.setdefault("resources", {}) if isinstance(c.get("resources", {}), dict) else {}
    limits = _dict(resources.get("limits"))
    value = limits.get(key)
    choice = rng.randrange(3)
    if choice == 0 and value is not None:  # requests only
        resources["requests"] = {key: limits.pop(key)}
    elif choice == 1:
        resources["requests"] = {key: "0"}
    else:
        resources["requests"] = {key: value}


def opt_out_and_profiles(rng: random.Random, doc: Review) -> None:
    meta = _obj(doc).setdefault("metadata", {})
    if isinstance(meta, dict):
        labels = meta.setdefault("labels", {})
        if isinstance(labels, dict):
            labels[rng.choice(["gpugate.io/skip", "gpugate.io/profile", "gpugate.io/gpus"])] = rng.choice(
                ["true", "training", "notebook", "inference", "1", "0"])


def noise(rng: random.Random, doc: Review) -> None:
    obj = _obj(doc)
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta, dict):
        return
    choice = rng.randrange(4)
    if choice == 0:
        annotations = meta.setdefault("annotations", {})
        if isinstance(annotations, dict):
            annotations["note"] = rng.choice(NOISE)
    elif choice == 1:
        nested: Any = "x"
        for _ in range(rng.randrange(10, 200)):
            nested = {"n": nested}
        spec = obj.get("spec")
        if isinstance(spec, dict):
            spec["x-unknown"] = nested
    elif choice == 2:
        for _, c in _containers(obj):
            c["env"] = [{"name": "PAGE", "value": rng.choice(NOISE)}]  # a dict: _containers keeps no other
    else:
        meta["namespace"] = rng.choice(ML + WEB)  # the object's namespace is not the request's


def dry_run(rng: random.Random, doc: Review) -> None:
    request = _dict(doc.get("request"))
    request["dryRun"] = rng.random() < 0.5


SCALARS = (None, True, 0, -1, 10**12, 1.5, "", "8", "nvidia.com/gpu", [], {})


def damage(rng: random.Random, doc: Review) -> None:
    """Replace, delete or insert a random value at a random path of the document."""
    paths: list[tuple[Any, Any]] = []

    def walk(node: Any, depth: int) -> None:
        if depth > 40:
            return
        if isinstance(node, dict):
            for key in list(node):
                paths.append((node, key))
                walk(node[key], depth + 1)
        elif isinstance(node, list):
            for i in range(len(node)):
                paths.append((node, i))
                walk(node[i], depth + 1)

    walk(doc, 0)
    if not paths:
        return
    parent, key = rng.choice(paths)
    action = rng.randrange(3)
    if action == 0:
        del parent[key]
    elif action == 1:
        parent[key] = copy.deepcopy(rng.choice(SCALARS))
    elif isinstance(parent, dict):
        parent[f"k{rng.randrange(9)}"] = copy.deepcopy(rng.choice(SCALARS))
    else:
        parent.insert(key, copy.deepcopy(rng.choice(SCALARS)))


MUTATIONS: tuple[Mutation, ...] = (move_to_another_container, split_over_containers, into_init_container,
                                   spell_as_dra_name, spell_the_quantity, requests_and_limits,
                                   opt_out_and_profiles, noise, dry_run, damage)


def mutated(rng: random.Random, bases: list[tuple[str, dict[str, Any]]]) -> tuple[Review, bytes]:
    """A review from a seed through 1-4 mutations, and its body (now and then with a duplicate key:
    a parser that keeps the first value would read another pod than one keeping the last)."""
    namespace, obj = rng.choice(bases)
    doc = review(namespace, obj)
    for _ in range(rng.randint(1, 4)):
        rng.choice(MUTATIONS)(rng, doc)
    body = json.dumps(doc).encode()
    if rng.random() < 0.05 and b'"limits": {"' in body:
        body = body.replace(b'"limits": {"', b'"limits": {"nvidia.com/gpu": "0", "', 1)
        doc = json.loads(body)  # the last value wins for a duplicate key, in Python and in Go alike
    return doc, body


# --- running against a server ---------------------------------------------------------------------

@dataclass
class Report:
    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    allowed: int = 0
    denied: int = 0
    must_deny: int = 0
    wrong_allows: list[Review] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)

    def summary(self) -> str:
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        return (f"{self.sent} reviews in {self.seconds:.0f} s ({statuses}); /validate allowed {self.allowed}, "
                f"denied {self.denied}; the oracle's must-deny reviews: {self.must_deny}; wrong allows: "
                f"{len(self.wrong_allows)}; 5xx: {self.server_errors}; malformed answers: {len(self.malformed)}")


class Fuzz:
    """Send ``count`` mutated reviews to ``post(endpoint, body)`` (a served webhook) and judge them."""

    def __init__(self, post: Callable[[str, bytes], Any], *, seed: int = 42) -> None:
        self._post = post
        self._rng = random.Random(seed)
        self._bases = seeds()

    def run(self, count: int, *, mutate_every: int = 5) -> Report:
        report = Report()
        started = time.monotonic()
        for i in range(count):
            doc, body = mutated(self._rng, self._bases)
            endpoint = "mutate" if mutate_every and i % mutate_every == mutate_every - 1 else "validate"
            http = self._post(endpoint, body)
            report.sent += 1
            report.statuses[http.status_code] += 1
            problem = check(http, doc)
            if problem:
                report.malformed.append(problem)
            if endpoint != "validate" or http.status_code != 200 or problem:
                continue
            allowed = http.json()["response"]["allowed"]
            report.allowed += allowed
            report.denied += not allowed
            if must_deny(doc):
                report.must_deny += 1
                if allowed:
                    report.wrong_allows.append(doc)
        report.seconds = time.monotonic() - started
        return report


def check(http: Any, doc: Review) -> str:
    """What is wrong with an answer ('' when nothing): a 200 must be a review for the request's uid."""
    if http.status_code >= 500:
        return f"{http.status_code}: {http.text[:200]}"
    if http.status_code != 200:
        return "" if "error" in http.json() else f"{http.status_code} without an error: {http.text[:200]}"
    answer = http.json()
    response = _dict(answer.get("response"))
    request = _dict(_dict(doc).get("request"))
    if answer.get("kind") != "AdmissionReview" or response.get("uid") != request.get("uid") \
            or not isinstance(response.get("allowed"), bool):
        return f"not a review for uid {request.get('uid')!r}: {http.text[:200]}"
    if response["allowed"] is False and not _dict(response.get("status")).get("message"):
        return f"a denial without a message: {http.text[:200]}"
    return ""
