"""Render kustomizations with the real kubectl and validate what they produce.

Built-in kinds are checked by ``kubernetes-validate`` in strict mode (unknown fields are
errors, as the API server's strict field validation would make them); custom resources
(cert-manager, Prometheus Operator, Argo CD, NVIDIA) are checked against the strict JSON
schemas kept under ``<schema_root>/json/<group>/<kind>_<version>.json``. Both are edges
(a subprocess and files); the tests and any CLI call the same two functions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema

from webhook.errors import GpugateError
from webhook.stack import rendering

KubeObject = dict[str, Any]

INSTALL_VALIDATOR = "pip install 'gpugate[stack]' (from a checkout: pip install -e '.[stack]')"


class ValidatorMissing(GpugateError):
    """kubernetes-validate (the ``stack`` extra) is not installed."""

# kubectl kustomize of a small tree takes well under a second; a hang is a bug, not a load.
KUSTOMIZE_TIMEOUT_SECONDS = 120


def kustomize(path: Path) -> list[KubeObject]:
    """Render ``path`` with the real ``kubectl kustomize`` and return its objects in order.

    Raises GpugateError carrying kubectl's own stderr, so a broken kustomization points at
    the file and field kubectl complained about.
    """
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise GpugateError("kubectl is not on PATH; install kubectl (it bundles kustomize) to render manifests")
    if not Path(path).is_dir():
        raise GpugateError(f"{path}: not a directory; kustomize needs a folder holding a kustomization.yaml")
    documents = rendering.rendered_documents([kubectl, "kustomize", str(path)], what=f"kubectl kustomize {path}",
                                             timeout=KUSTOMIZE_TIMEOUT_SECONDS)
    objects: list[KubeObject] = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        if not isinstance(document, dict):
            raise GpugateError(f"kubectl kustomize {path}: document {index + 1} is not a mapping")
        objects.append(document)
    return objects


def validate_objects(
    objs: list[KubeObject], *, kubernetes_version: str, schema_root: Path | None
) -> list[str]:
    """Return every problem found in ``objs``, each as ``"Kind/name: message"``; empty means valid.

    ``kubernetes_version`` (``"1.NN"``) has no default on purpose: it is the cluster's, and its one
    home is ``cluster.kubernetesVersion`` in manifests/gpu-operator/stack.yaml (``gpugate stack``
    passes the stack's; the tests read it through tests/kubeversion.py).

    Custom resources whose schema file is absent are reported as "no schema" only when
    ``schema_root`` is given and exists: without the shared schemas (a fresh clone) they
    cannot be checked, and saying so is the caller's job (the tests skip with a reason).
    """
    try:  # deferred: the webhook image does not ship it (it is in the test extra)
        import kubernetes_validate
        from kubernetes_validate import utils as kv_utils
    except ImportError as err:
        raise ValidatorMissing(
            f"validating manifests needs the kubernetes-validate package: {INSTALL_VALIDATOR}"
        ) from err

    use_schemas = schema_root is not None and Path(schema_root).is_dir()
    schema_cache: dict[Path, Any] = {}
    problems: list[str] = []
    for obj in objs:
        label = _label(obj)
        api_version = obj.get("apiVersion") if isinstance(obj, dict) else None
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if not isinstance(api_version, str) or not api_version or not isinstance(kind, str) or not kind:
            problems.append(f"{label}: apiVersion and kind are required")
            continue
        try:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
            continue
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{label}: {_where(err.absolute_path)}{err.message}")
            continue
        except kv_utils.VersionNotSupportedError as err:
            raise GpugateError(
                f"kubernetes-validate {kubernetes_validate.__version__} has no schemas for Kubernetes "
                f"{kubernetes_version}"
            ) from err
        except kubernetes_validate.SchemaNotFoundError:
            pass  # not a built-in kind at this version: maybe a custom resource
        group, _, version = api_version.rpartition("/")
        if _is_builtin_group(group):
            problems.append(
                f"{label}: Kubernetes {kubernetes_version} serves no {kind} in {api_version} "
                "(wrong apiVersion or kind)"
            )
            continue
        if use_schemas:
            assert schema_root is not None
            problems += _custom_resource_problems(obj, label, Path(schema_root) / "json" / group,
                                                  api_version, kind, version, schema_cache)
    return problems


def _custom_resource_problems(obj: KubeObject, label: str, folder: Path, api_version: str, kind: str, version: str,
                              schema_cache: dict[Path, Any]) -> list[str]:
    """A custom resource checked against its CRD's schema (``<folder>/<kind>_<version>.json``), strictly."""
    schema_file = folder / f"{kind.lower()}_{version}.json"
    if not schema_file.is_file():
        crd = _crd_schema(folder.parents[1], folder.name, kind, version)
        if crd is None:
            return [f"{label}: no schema for {api_version} {kind} (looked for {schema_file})"]
        schema_cache.setdefault(schema_file, _strict(crd))
    if schema_file not in schema_cache:
        schema_cache[schema_file] = _strict(json.loads(schema_file.read_text()))
    schema = schema_cache[schema_file]
    validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    errors = sorted(validator_cls(schema).iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{label}: {_where(e.absolute_path)}{e.message}" for e in errors]


def _crd_schema(root: Path, group: str, kind: str, version: str) -> dict[str, Any] | None:
    """The ``openAPIV3Schema`` of ``kind``/``version`` from an upstream CRD file ``<root>/<group>_<plural>.yaml``
    (where no JSON schema was derived from it); None when there is none."""
    import yaml  # deferred like the validator: only the shared schemas' CRD files need it

    for path in sorted(root.glob(f"{group}_*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            spec = (crd or {}).get("spec") or {}
            if spec.get("group") != group or (spec.get("names") or {}).get("kind") != kind:
                continue
            for served in spec.get("versions") or ():
                if served.get("name") == version:
                    return dict((served.get("schema") or {}).get("openAPIV3Schema") or {})
    return None


def _label(obj: Any) -> str:
    if not isinstance(obj, dict):
        return "?/?"
    found = obj.get("metadata")
    metadata: dict[str, Any] = found if isinstance(found, dict) else {}
    return f"{obj.get('kind') or '?'}/{metadata.get('name') or metadata.get('generateName') or '?'}"


def _where(path: Any) -> str:
    parts = [str(p) for p in path]
    return f"{'.'.join(parts)}: " if parts else ""


def _is_builtin_group(group: str) -> bool:
    """Core ("") and the dotless groups (apps, batch, policy...) or *.k8s.io are Kubernetes' own."""
    return "." not in group or group.endswith(".k8s.io")


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Refuse unknown top-level fields too; the CRD schemas are strict only below the top."""
    if isinstance(schema, dict) and "properties" in schema and "additionalProperties" not in schema:
        return {**schema, "additionalProperties": False}
    return schema
