"""The admission routes of a real ``gpugate serve`` over verified TLS: the response contract and bad input."""

from __future__ import annotations

import json
import socket
import ssl
import time

import jsonpatch
import pytest
import requests

from tests.server.harness import SERVICE_HOST, Server, copy_policies, example_pod, https_session, review_of
from webhook.admission import reviews
from webhook.server.serverstate import MAX_BODY_BYTES


def _response(http: requests.Response) -> dict:
    assert http.status_code == 200, http.text
    assert http.headers["Content-Type"].startswith("application/json")
    document = http.json()
    assert document["apiVersion"] == "admission.k8s.io/v1" and document["kind"] == "AdmissionReview"
    return document["response"]


def test_mutate_patches_the_example_pod_and_echoes_the_uid(server):
    review = review_of(example_pod())
    response = _response(server.post("mutate", review))
    assert response["uid"] == review["request"]["uid"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    patched = jsonpatch.apply_patch(review["request"]["object"], reviews.decode_patch(response["patch"]))
    trainer = patched["spec"]["containers"][0]["resources"]
    assert trainer["requests"]["nvidia.com/gpu"] == trainer["limits"]["nvidia.com/gpu"] == "4"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in patched["spec"]["tolerations"]
    revision = response["auditAnnotations"]["revision"]
    assert len(revision) == 12
    assert response["auditAnnotations"]["policy"] == f"training@{revision}"
    assert patched["metadata"]["annotations"]["gpugate.io/policy"] == f"training@{revision}"
    assert response["warnings"] and all(w.startswith(f"gpugate training@{revision}") for w in response["warnings"])


def test_the_mutated_pod_mutates_to_no_patch(server):
    """reinvocationPolicy: IfNeeded is safe: a second pass changes nothing and sends no patch fields."""
    review = review_of(example_pod())
    first = _response(server.post("mutate", review))
    again = review_of(jsonpatch.apply_patch(review["request"]["object"], reviews.decode_patch(first["patch"])))
    second = _response(server.post("mutate", again))
    assert second["allowed"] is True
    assert "patch" not in second and "patchType" not in second
    assert second["auditAnnotations"]["policy"].startswith("training@")


def test_dry_run_is_answered_the_same(server):
    pod = example_pod()
    wet = _response(server.post("mutate", review_of(pod)))
    dry = _response(server.post("mutate", review_of(pod, dry_run=True)))
    assert reviews.decode_patch(dry["patch"]) == reviews.decode_patch(wet["patch"])
    assert dry["warnings"] == wet["warnings"] and dry["auditAnnotations"] == wet["auditAnnotations"]


def test_validate_denies_with_403_and_a_message(server):
    response = _response(server.post("validate", review_of(example_pod(), namespace="web-shop")))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "GPUs are not available in web and frontend namespaces" in response["status"]["message"]
    assert response["auditAnnotations"]["policy"].startswith("web-no-gpus@")
    assert "patch" not in response


def test_validate_allows_the_mutated_example_pod(server):
    review = review_of(example_pod())
    mutated = _response(server.post("mutate", review))
    pod = jsonpatch.apply_patch(review["request"]["object"], reviews.decode_patch(mutated["patch"]))
    response = _response(server.post("validate", review_of(pod)))
    assert response["allowed"] is True and "status" not in response
    assert response["auditAnnotations"]["revision"] == mutated["auditAnnotations"]["revision"]


def test_validate_denies_more_gpus_than_the_policy_allows(server):
    """A container that asks 12 itself (the mutating endpoint already refuses a gpus label of 12)."""
    pod = example_pod()
    del pod["metadata"]["labels"]["gpugate.io/gpus"]
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "12"},
                                                 "requests": {"nvidia.com/gpu": "12"}}
    review = review_of(pod)
    mutated = _response(server.post("mutate", review))   # the validating call sees the mutated pod
    pod = jsonpatch.apply_patch(pod, reviews.decode_patch(mutated["patch"]))
    response = _response(server.post("validate", review_of(pod)))
    assert response["allowed"] is False and "allows 8" in response["status"]["message"]


@pytest.mark.parametrize(("change", "why"), [
    ({"operation": "UPDATE"}, "only CREATE is handled"),
    ({"operation": "DELETE", "object": None}, "DELETE carries no object"),
    ({"subResource": "status"}, "a subresource is not the pod"),
    ({"kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
      "resource": {"group": "apps", "version": "v1", "resource": "deployments"}}, "not a Pod"),
])
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_requests_the_webhook_does_not_handle_are_allowed_without_patch(server, endpoint, change, why):
    review = review_of(example_pod(), namespace="web-shop")  # would be denied/patched if handled
    review["request"].update(change)
    response = _response(server.post(endpoint, review))
    assert response == {"uid": review["request"]["uid"], "allowed": True}, why


@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "not JSON"),
    (b"\xff\xfe\x00garbage", "not JSON"),
    (b"[1, 2]", "JSON list, not an AdmissionReview"),
    (b"[" * 100_000, "nests JSON more than 1,024 levels"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                 "request": {"uid": "u", "operation": "CREATE"}}), "admission.k8s.io/v1beta1"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "ConversionReview"}), "kind is 'ConversionReview'"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "no request object"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"operation": "CREATE", "object": {}}}), "request.uid is missing"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"uid": "", "operation": "CREATE"}}), "request.uid is missing"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"uid": "u", "operation": "CREATE", "object": [1]}}), "request.object is a JSON list"),
])
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_malformed_reviews_get_400_saying_what_is_wrong(server, endpoint, body, message):
    http = server.post(endpoint, body)
    assert http.status_code == 400
    assert message in http.json()["error"]


def test_a_body_over_what_the_api_server_can_send_gets_413_on_its_declared_length(server):
    review = review_of(example_pod())
    review["request"]["object"]["metadata"]["annotations"] = {"big": "x" * MAX_BODY_BYTES}
    http = server.post("mutate", review)
    assert http.status_code == 413 and f"{MAX_BODY_BYTES}-byte limit" in http.json()["error"]


def test_a_chunked_body_over_what_the_api_server_can_send_gets_413(server):
    def chunks():
        yield b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"x": "'
        for _ in range(MAX_BODY_BYTES // (1024 * 1024) + 1):
            yield b"y" * (1024 * 1024)
        yield b'"}}'

    http = server.post("validate", chunks())
    assert http.status_code == 413


def test_a_review_just_under_the_limit_is_answered(server):
    review = review_of(example_pod())
    review["request"]["object"]["metadata"]["annotations"] = {"big": "x" * (3 * 1024 * 1024 - 4096)}
    assert len(json.dumps(review)) < 3 * 1024 * 1024
    assert _response(server.post("validate", review))["allowed"] is True


def test_the_connection_survives_bad_requests(server):
    """A 400 or 413 must not break the keep-alive connection for the next review."""
    with https_session(server.ca, pool=1) as session:
        for _ in range(3):
            assert session.post(f"{server.url}/mutate", data=b"nope", timeout=10).status_code == 400
            ok = session.post(f"{server.url}/mutate", data=json.dumps(review_of(example_pod())), timeout=10)
            assert ok.status_code == 200


def test_health_readiness_and_unknown_routes(server):
    assert server.session.get(f"{server.url}/healthz", timeout=5).json() == {"ok": True}
    ready = server.session.get(f"{server.url}/readyz", timeout=5)
    assert ready.status_code == 200 and len(ready.json()["revision"]) == 12
    assert server.session.get(f"{server.url}/nope", timeout=5).status_code == 404
    assert server.session.get(f"{server.url}/mutate", timeout=5).status_code == 405


def test_metrics_name_the_admissions(server):
    before = server.metrics()
    _response(server.post("validate", review_of(example_pod(), namespace="web-shop")))
    after = server.metrics()
    revision = _response(server.post("mutate", review_of(example_pod())))["auditAnnotations"]["revision"]
    key = (f'gpugate_admissions_total{{endpoint="validate",operation="CREATE",'
           f'policy="web-no-gpus@{revision}",result="denied"}}')
    assert after[key] == before.get(key, 0) + 1
    assert after[f'gpugate_policy_revision_info{{revision="{revision}"}}'] == 1
    assert after["gpugate_policy_reloads_total"] >= 1
    # Latency by result and policy name (the dashboard's split); the revision stays out of its labels.
    assert after['gpugate_admission_duration_seconds_count{endpoint="validate",policy="web-no-gpus",result="denied"}'] \
        == before.get('gpugate_admission_duration_seconds_count{endpoint="validate",policy="web-no-gpus",'
                      'result="denied"}', 0) + 1
    # Counted once the mutate above has patched (this test may be the first on its server).
    assert any(k.startswith("gpugate_patch_operations_total{") for k in server.metrics())


def test_one_json_log_line_per_admission(server):
    review = review_of(example_pod())
    review["request"]["namespace"] = "ml-logs"
    _response(server.post("mutate", review))
    uid = review["request"]["uid"]
    lines = [line for line in server.log_lines() if line.get("uid") == uid]
    assert len(lines) == 1
    line = lines[0]
    assert line["event"] == "admission" and line["namespace"] == "ml-logs"
    assert line["pod"] == "llama-finetune-0-"            # generateName of a controller-made pod
    assert line["policy"].startswith("training@") and line["revision"] == line["policy"].split("@")[1]
    assert line["patch_ops"] >= 3 and line["result"] == "patched" and line["duration_ms"] > 0


def _handshake(server: Server, maximum: ssl.TLSVersion) -> str:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(server.ca))
    context.set_ciphers("ALL:@SECLEVEL=0")   # let this client offer TLS 1.0/1.1 at all
    context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    context.maximum_version = maximum
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=SERVICE_HOST) as tls:
            return str(tls.version())


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_1_2_is_the_floor(server):
    assert _handshake(server, ssl.TLSVersion.TLSv1_2) == "TLSv1.2"
    assert _handshake(server, ssl.TLSVersion.MAXIMUM_SUPPORTED) == "TLSv1.3"
    with pytest.raises(ssl.SSLError) as refused:
        _handshake(server, ssl.TLSVersion.TLSv1_1)
    assert "NO_PROTOCOLS_AVAILABLE" not in str(refused.value)   # the server refused, not this client


def test_the_certificate_is_refused_for_another_name(server):
    with https_session(server.ca, server_hostname="evil.example") as session:
        with pytest.raises(requests.exceptions.SSLError):
            session.get(f"{server.url}/healthz", timeout=5)


def test_plain_http_gets_no_admission(server):
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(f"http://127.0.0.1:{server.port}/mutate", data=b"{}", timeout=5)


def test_self_signed_certificates_are_reused_on_restart(module_tmp, server):
    ca_before = server.ca.read_bytes()
    again = Server(module_tmp / "again", policies=copy_policies(module_tmp / "again-policies"))
    again.state_dir = server.state_dir   # the same state dir as the module's server
    again.args[again.args.index("--state-dir") + 1] = str(server.state_dir)
    again.ca = server.ca
    (module_tmp / "again").mkdir()
    again.start()
    try:
        assert server.ca.read_bytes() == ca_before
        assert "self-signed CA at" in again.log_text() and str(server.ca.name) in again.log_text()
        assert _response(again.post("mutate", review_of(example_pod())))["allowed"] is True
    finally:
        again.stop()


def test_without_a_valid_policy_set_it_is_not_ready_and_fails_open_or_closed(module_tmp):
    """No valid set loaded is an internal error: allowed with a warning, or denied with --fail-closed."""
    bad = module_tmp / "bad-policies"
    bad.mkdir()
    (bad / "broken.yaml").write_text("apiVersion: gpugate.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: x}\n"
                                     "spec: {gpu: {max: eight}}\n")
    for extra, allowed in (([], True), (["--fail-closed"], False)):
        workdir = module_tmp / f"bad-{allowed}"
        workdir.mkdir()
        srv = Server(workdir, policies=bad, extra=extra, workers=1).start(wait_ready=False)
        try:
            assert srv.session.get(f"{srv.url}/readyz", timeout=5).status_code == 503
            review = review_of(example_pod())
            response = _response(srv.post("mutate", review))
            assert response["allowed"] is allowed and "patch" not in response
            assert "internal error" in response["warnings"][0] and review["request"]["uid"] in response["warnings"][0]
            if not allowed:
                assert response["status"]["code"] == 403 and "fails closed" in response["status"]["message"]
            # Validation denies what it cannot judge either way (docs/server.md, "Validation fails closed").
            assert _response(srv.post("validate", review))["allowed"] is False
            errors = [line for line in srv.log_lines() if line.get("uid") == review["request"]["uid"]]
            assert errors and errors[0]["result"] == "error" and "no valid policy set" in errors[0]["error"]
            refused = [line for line in srv.log_lines() if line.get("event") == "policy reload refused"]
            assert refused and "spec.gpu.max" in refused[0]["error"]
        finally:
            srv.stop()


# --- gpugate admit against the same server ---------------------------------------------------------

def _admit(server: Server, *args: str):
    from click.testing import CliRunner

    from webhook.cli import main

    return CliRunner().invoke(main, ["admit", *args, "--server", server.url, "--ca", str(server.ca),
                                     "--server-name", SERVICE_HOST])


def test_admit_wraps_a_pod_and_prints_the_decoded_patch(server):
    from tests.server.harness import EXAMPLE_POD

    result = _admit(server, str(EXAMPLE_POD), "--namespace", "ml-vision")
    assert result.exit_code == 0, result.output
    assert "mutate: allowed" in result.output and "validate: allowed" in result.output
    assert "patch (5 operations, JSONPatch)" in result.output
    assert '"path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"' in result.output
    assert "audit policy: training@" in result.output


def test_admit_exits_1_on_a_denial(server, tmp_path):
    from tests.server.harness import EXAMPLE_POD

    result = _admit(server, str(EXAMPLE_POD), "--namespace", "web-shop", "--endpoint", "validate")
    assert result.exit_code == 1
    assert "validate: DENIED" in result.output and "reason (403): " in result.output


def test_admit_stops_at_a_mutation_refusal_as_the_api_server_does(server, tmp_path):
    """It printed "validate: allowed" after "mutate: DENIED"; the API server never asks the
    validating webhook about an object a mutating one refused."""
    pod = example_pod()
    pod["metadata"]["labels"]["gpugate.io/gpus"] = "100"
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod))
    result = _admit(server, str(path), "--namespace", "ml-vision")
    assert result.exit_code == 1
    assert "mutate: DENIED" in result.output and "validate: allowed" not in result.output
    assert "validate: not asked (the API server stops at the mutating webhook's refusal)" in result.output


def test_admit_sends_a_review_file_as_is(server, tmp_path):
    review = review_of(example_pod(), namespace="ml-vision")
    review["request"]["operation"] = "UPDATE"
    path = tmp_path / "review.json"
    path.write_text(json.dumps(review))
    result = _admit(server, str(path), "--endpoint", "mutate", "--output", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["response"] == {"uid": review["request"]["uid"], "allowed": True}


def test_admit_reports_the_servers_400(server, tmp_path):
    path = tmp_path / "review.yaml"
    path.write_text("apiVersion: admission.k8s.io/v1beta1\nkind: AdmissionReview\n"
                    "request: {uid: u, operation: CREATE}\n")
    result = _admit(server, str(path), "--endpoint", "mutate")
    assert result.exit_code == 1
    assert "answered HTTP 400" in result.output and "admission.k8s.io/v1beta1" in result.output


def test_admit_refuses_a_server_it_cannot_verify(server, tmp_path):
    from click.testing import CliRunner

    from tests.server.harness import EXAMPLE_POD
    from webhook.cli import main

    result = CliRunner().invoke(main, ["admit", str(EXAMPLE_POD), "--server", server.url, "--ca", str(server.ca),
                                       "--server-name", "not-the-service.example"])
    assert result.exit_code == 1 and "TLS with" in result.output


def test_an_absurd_gpu_label_is_denied_by_the_mutating_endpoint(server):
    pod = example_pod()
    pod["metadata"]["labels"]["gpugate.io/gpus"] = "1k"
    answer = server.post("mutate", review_of(pod, namespace="ml-team")).json()["response"]
    assert answer["allowed"] is False and "patch" not in answer
    assert "gpugate.io/gpus='1k' asks for 1000 GPUs" in answer["status"]["message"]


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(("where", "value"), [
    ("containers", "not-a-list"),            # a field of the wrong type
    ("affinity", _nested(900)),              # nesting no Kubernetes object has
])
def test_input_the_core_cannot_read_is_one_warning_line_counted_as_invalid(server, where, value):
    """Bad input is a one-line warning with the uid and result=invalid; tracebacks are for our bugs."""
    pod = example_pod()
    pod["spec"][where] = value
    review = review_of(pod, namespace="ml-team")
    before = server.metrics().get('gpugate_admissions_total{endpoint="mutate",operation="CREATE",policy="",'
                                  'result="invalid"}', 0)
    response = server.post("mutate", review)
    assert response.status_code == 200
    answer = response.json()["response"]
    assert answer["allowed"] is True and "could not read this pod" in answer["warnings"][0]
    time.sleep(0.2)
    lines = [line for line in server.log_lines() if line.get("uid") == review["request"]["uid"]]
    assert lines and all("exception" not in line for line in lines), lines
    assert any(line.get("level") == "warning" and line.get("event") == "admission input refused" for line in lines)
    assert any(line.get("event") == "admission" and line.get("result") == "invalid" for line in lines)
    after = server.metrics()['gpugate_admissions_total{endpoint="mutate",operation="CREATE",policy="",'
                             'result="invalid"}']
    assert after == before + 1
