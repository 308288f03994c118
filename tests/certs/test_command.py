"""``gpugate certs --secret ... --patch-webhooks ...`` against the fake API server, with the real client.

The webhook configurations put into the fake are the ones manifests/webhook renders, and the
command runs with the Job's own arguments, so these tests prove the Job works on what we ship.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509

from tests.kubefake import FakeKube, fake_kube  # noqa: F401 - the fixture is used by name
from tests.manifests.helpers import NAMESPACE, one, render_variant, rule_allows
from webhook.certs import pki, publish
from webhook.cli import main

SECRET = "gpugate-webhook-tls"
CONFIG_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
ADMISSION = "admissionregistration.k8s.io/v1"
WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def _job_args() -> list[str]:
    job = one(render_variant("webhook+builtin-tls"), "Job", "gpugate-certs")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["gpugate", "certs"]
    return list(container["args"])


def _load_webhook_configs(fk: FakeKube) -> None:
    objs = render_variant("webhook")
    for kind in CONFIG_KINDS:
        fk.put(one(objs, kind, "gpugate-webhook"))


def _run(fk: FakeKube, *extra: str):
    result = CliRunner().invoke(main, ["certs", *_job_args(), "--server", fk.url, *extra])
    return result


def _secret(fk: FakeKube) -> dict[str, bytes]:
    obj = fk.get("v1", "Secret", SECRET, NAMESPACE)
    assert obj is not None
    assert obj["type"] == "kubernetes.io/tls"
    return {key: base64.b64decode(value) for key, value in obj["data"].items()}


def _bundles(fk: FakeKube) -> dict[str, list[x509.Certificate]]:
    found = {}
    for kind in CONFIG_KINDS:
        for hook in fk.get(ADMISSION, kind, "gpugate-webhook")["webhooks"]:
            found[f"{kind}/{hook['name']}"] = x509.load_pem_x509_certificates(
                base64.b64decode(hook["clientConfig"]["caBundle"]))
    return found


def _writes(fk: FakeKube, since: int = 0) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in fk.requests[since:] if r.method in WRITE_METHODS]


def test_creates_the_secret_when_missing_and_patches_both_ca_bundles(fake_kube: FakeKube) -> None:
    _load_webhook_configs(fake_kube)
    result = _run(fake_kube)
    assert result.exit_code == 0, result.output
    data = _secret(fake_kube)
    assert set(data) == {"tls.crt", "tls.key", "ca.crt"}
    labels = fake_kube.get("v1", "Secret", SECRET, NAMESPACE)["metadata"]["labels"]
    assert (labels["app.kubernetes.io/part-of"] == "gpugate"
            and labels["app.kubernetes.io/managed-by"] == "gpugate-certs")
    pki.check_pair(data["tls.crt"], data["tls.key"])
    served = x509.load_pem_x509_certificate(data["tls.crt"])
    sans = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert f"gpugate-webhook.{NAMESPACE}.svc" in sans
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    served.verify_directly_issued_by(ca)  # the caBundle below really verifies the serving cert
    bundles = _bundles(fake_kube)
    assert set(bundles) == {"MutatingWebhookConfiguration/mutate.gpugate.io",
                            "ValidatingWebhookConfiguration/validate.gpugate.io"}
    assert all(bundle == [ca] for bundle in bundles.values())
    assert "created (missing)" in result.output
    assert "caBundle patched on 1 of 1 webhook(s)" in result.output


def test_patches_are_json_patches_pinned_by_a_test_op(fake_kube: FakeKube) -> None:
    _load_webhook_configs(fake_kube)
    assert _run(fake_kube).exit_code == 0
    patches = [r for r in fake_kube.requests if r.method == "PATCH"]
    assert len(patches) == 2
    for request in patches:
        assert request.content_type.startswith("application/json-patch+json")
        assert request.body[0]["op"] == "test" and request.body[0]["path"] == "/webhooks/0/name"
        assert request.body[1]["path"] == "/webhooks/0/clientConfig/caBundle"


def test_second_run_changes_nothing(fake_kube: FakeKube) -> None:
    _load_webhook_configs(fake_kube)
    assert _run(fake_kube).exit_code == 0
    before_secret = fake_kube.get("v1", "Secret", SECRET, NAMESPACE)
    before_configs = [fake_kube.get(ADMISSION, kind, "gpugate-webhook") for kind in CONFIG_KINDS]
    seen = len(fake_kube.requests)
    result = _run(fake_kube)
    assert result.exit_code == 0, result.output
    assert _writes(fake_kube, seen) == []
    assert fake_kube.get("v1", "Secret", SECRET, NAMESPACE) == before_secret
    assert [fake_kube.get(ADMISSION, kind, "gpugate-webhook") for kind in CONFIG_KINDS] == before_configs
    assert "unchanged" in result.output and "patched" not in result.output


def _due_secret(now: datetime, *, remaining_days: int) -> tuple[dict, pki.CertBundle]:
    """A Secret whose certificate has ``remaining_days`` left."""
    bundle = pki.create_bundle(service="gpugate-webhook", namespace=NAMESPACE,
                                 now=now - timedelta(days=365 - remaining_days), days=365)
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
              "metadata": {"name": SECRET, "namespace": NAMESPACE, "labels": {"keep": "me"}},
              "data": {"tls.crt": base64.b64encode(bundle.cert).decode(),
                       "tls.key": base64.b64encode(bundle.key).decode(),
                       "ca.crt": base64.b64encode(bundle.ca_cert).decode()}}
    return secret, bundle


def test_renews_when_due_and_keeps_the_old_ca_trusted_meanwhile(fake_kube: FakeKube) -> None:
    now = datetime.now(UTC)
    secret, old = _due_secret(now, remaining_days=10)  # inside the Job's 30-day window
    fake_kube.put(secret)
    _load_webhook_configs(fake_kube)
    for kind in CONFIG_KINDS:  # as after an earlier run: the configs trust the old CA
        config = fake_kube.get(ADMISSION, kind, "gpugate-webhook")
        config["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(old.ca_cert).decode()
        fake_kube.put(config)
    seen = len(fake_kube.requests)
    result = _run(fake_kube)
    assert result.exit_code == 0, result.output
    assert "renewed (expires" in result.output
    data = _secret(fake_kube)
    assert data["tls.crt"] != old.cert
    assert pki.not_after(data["tls.crt"]) > now + timedelta(days=360)
    assert fake_kube.get("v1", "Secret", SECRET, NAMESPACE)["metadata"]["labels"]["keep"] == "me"
    put = [r for r in fake_kube.requests[seen:] if r.method == "PUT"]
    assert len(put) == 1  # one replace of the Secret (a concurrent writer gets 409: next test)
    new_ca = x509.load_pem_x509_certificate(data["ca.crt"])
    old_ca = x509.load_pem_x509_certificate(old.ca_cert)
    for bundle in _bundles(fake_kube).values():
        assert bundle == [new_ca, old_ca]
    # ...and the run after the renewal is quiet again.
    seen = len(fake_kube.requests)
    assert _run(fake_kube).exit_code == 0
    assert _writes(fake_kube, seen) == []


@pytest.mark.parametrize(("due", "method", "path", "code", "says", "hint"), [
    (True, "PUT", rf"/secrets/{SECRET}$", 409, "cannot replace Secret", "run again"),
    (False, "POST", r"/secrets$", 403, "cannot create Secret", "RBAC"),
], ids=["a concurrent change of the secret", "no right to create it"])
def test_api_errors_name_the_object_and_the_status_and_no_ca_bundle_moves(
        fake_kube: FakeKube, due: bool, method: str, path: str, code: int, says: str, hint: str) -> None:
    """A failed write of the Secret (a renewal that lost a race, a create RBAC refuses) is an error
    naming the object, the status and what to do; no caBundle is patched to a CA that was not saved."""
    if due:
        secret, _ = _due_secret(datetime.now(UTC), remaining_days=1)
        fake_kube.put(secret)
    _load_webhook_configs(fake_kube)
    fake_kube.fail_next(method, path, code=code)
    result = _run(fake_kube)
    assert result.exit_code == 1
    assert f"{says} {NAMESPACE}/{SECRET}: HTTP {code}" in result.output
    assert hint in result.output
    assert not [r for r in fake_kube.requests if r.method == "PATCH"], "caBundles must not move to an unsaved CA"


def test_a_valid_secret_is_kept_and_only_a_stale_ca_bundle_is_patched(fake_kube: FakeKube) -> None:
    """As after an Argo CD sync that re-created a configuration without its caBundle."""
    _load_webhook_configs(fake_kube)
    assert _run(fake_kube).exit_code == 0
    secret_before = fake_kube.get("v1", "Secret", SECRET, NAMESPACE)
    fake_kube.put(one(render_variant("webhook"), "ValidatingWebhookConfiguration", "gpugate-webhook"))
    seen = len(fake_kube.requests)
    result = _run(fake_kube)
    assert result.exit_code == 0, result.output
    assert _writes(fake_kube, seen) == [
        ("PATCH", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/gpugate-webhook")]
    assert fake_kube.get("v1", "Secret", SECRET, NAMESPACE) == secret_before
    ca = x509.load_pem_x509_certificate(_secret(fake_kube)["ca.crt"])
    assert all(bundle == [ca] for bundle in _bundles(fake_kube).values())


def test_a_secret_for_another_service_is_replaced(fake_kube: FakeKube) -> None:
    bundle = pki.create_bundle(service="old-name", namespace=NAMESPACE, now=datetime.now(UTC))
    fake_kube.put({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                   "metadata": {"name": SECRET, "namespace": NAMESPACE},
                   "data": {"tls.crt": base64.b64encode(bundle.cert).decode(),
                            "tls.key": base64.b64encode(bundle.key).decode(),
                            "ca.crt": base64.b64encode(bundle.ca_cert).decode()}})
    _load_webhook_configs(fake_kube)
    result = _run(fake_kube)
    assert result.exit_code == 0, result.output
    assert f"renewed (does not name gpugate-webhook.{NAMESPACE}.svc)" in result.output


def test_every_call_the_job_makes_is_allowed_by_its_rbac(fake_kube: FakeKube) -> None:
    """Replays the requests of a create, a quiet run and a renewal against the component's Role/ClusterRole."""
    objs = render_variant("webhook+builtin-tls")
    role_rules = one(objs, "Role", "gpugate-certs")["rules"]
    cluster_rules = one(objs, "ClusterRole", "gpugate-certs")["rules"]
    _load_webhook_configs(fake_kube)
    assert _run(fake_kube).exit_code == 0
    assert _run(fake_kube).exit_code == 0
    secret, _ = _due_secret(datetime.now(UTC), remaining_days=1)
    fake_kube.put(secret)
    assert _run(fake_kube).exit_code == 0
    verbs = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    checked = 0
    for request in fake_kube.requests:
        parts = request.path.strip("/").split("/")
        verb = verbs[request.method]
        if parts[:2] == ["api", "v1"]:
            assert parts[2] == "namespaces" and parts[3] == NAMESPACE and parts[4] == "secrets", request.path
            name = parts[5] if len(parts) > 5 else None
            assert rule_allows(role_rules, verb=verb, group="", resource="secrets", name=name), request[:2]
        else:
            group, resource = parts[1], parts[3]
            name = parts[4] if len(parts) > 4 else None
            assert rule_allows(cluster_rules, verb=verb, group=group, resource=resource, name=name), request[:2]
        checked += 1
    assert checked >= 9


def test_missing_webhook_configurations_fail_with_a_clear_error(fake_kube: FakeKube) -> None:
    result = _run(fake_kube)
    assert result.exit_code == 1
    assert "no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named 'gpugate-webhook'" in \
        result.output
    # The Secret was made: the retry only has to patch.
    assert fake_kube.get("v1", "Secret", SECRET, NAMESPACE) is not None


# --- usage ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--patch-webhooks", "x"], "--patch-webhooks needs --secret"),
    ([], "--out DIR, --secret NS/NAME, or both"),
    (["--secret", "no-slash"], "NAMESPACE/NAME"),
    (["--secret", "a/b", "--patch-webhooks", "a,,b"], "NAME[,NAME]"),
    (["--out", "x", "--days", "10", "--renew-within", "10"], "must be less than --days"),
])
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["certs", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_local_bundle_is_made_once_and_renewed_when_due(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    runner = CliRunner()
    first = runner.invoke(main, ["certs", "--out", str(out)])
    assert first.exit_code == 0 and "created (missing)" in first.output
    made = (out / "tls.crt").read_bytes()
    second = runner.invoke(main, ["certs", "--out", str(out)])
    assert second.exit_code == 0 and "unchanged" in second.output
    assert (out / "tls.crt").read_bytes() == made
    old = pki.create_bundle(service="gpugate-webhook", namespace=NAMESPACE,
                              now=datetime.now(UTC) - timedelta(days=360), days=365)
    pki.write_bundle(old, out)
    third = runner.invoke(main, ["certs", "--out", str(out)])
    assert third.exit_code == 0 and "renewed (expires" in third.output
    assert pki.not_after((out / "tls.crt").read_bytes()) > datetime.now(UTC) + timedelta(days=300)


# --- the pure decisions -----------------------------------------------------------------------------

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def _data(bundle: pki.CertBundle) -> dict[str, bytes]:
    return {"tls.crt": bundle.cert, "tls.key": bundle.key, "ca.crt": bundle.ca_cert}


def test_renewal_reasons() -> None:
    good = pki.create_bundle(service="svc", namespace="ns", now=NOW, days=100)
    other = pki.create_bundle(service="svc", namespace="ns", now=NOW, days=100)
    reason = publish.renewal_reason
    assert reason(_data(good), service="svc", namespace="ns", now=NOW, within_days=30) is None
    assert reason(None, service="svc", namespace="ns", now=NOW, within_days=30) == "missing"
    assert reason({**_data(good), "ca.crt": b""}, service="svc", namespace="ns", now=NOW,
                  within_days=30) == "has no ca.crt"
    assert reason({**_data(good), "tls.key": other.key}, service="svc", namespace="ns", now=NOW,
                  within_days=30).startswith("is unreadable (tls.key is not the private key of tls.crt")
    assert reason(_data(good), service="svc", namespace="other", now=NOW,
                  within_days=30) == "does not name svc.other.svc"
    assert reason(_data(good), service="svc", namespace="ns", now=NOW + timedelta(days=71),
                  within_days=30).startswith("expires 2026-09-09")


def test_desired_ca_bundle() -> None:
    first = pki.create_bundle(service="svc", namespace="ns", now=NOW)
    second = pki.create_bundle(service="svc", namespace="ns", now=NOW)
    desired = publish.desired_ca_bundle
    assert desired(first.ca_cert, ca=first.ca_cert) is None                      # already trusted
    assert desired(None, ca=first.ca_cert) == first.ca_cert                     # empty: set it
    assert desired(b"garbage", ca=first.ca_cert) == first.ca_cert               # unreadable: replace
    assert desired(second.ca_cert + first.ca_cert, ca=first.ca_cert) is None    # trusted among others
    assert desired(first.ca_cert, ca=second.ca_cert) == second.ca_cert          # stale: replace
    renewed = desired(first.ca_cert, ca=second.ca_cert, previous_ca=first.ca_cert)
    assert renewed == second.ca_cert + first.ca_cert                            # renewal: new first, old kept
    assert desired(renewed, ca=second.ca_cert, previous_ca=first.ca_cert) is None
