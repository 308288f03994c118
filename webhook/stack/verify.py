"""Re-validate the manifests a stack change produces, before and after they are swapped in.

The checks the tests run too: every Helm values key exists in the target chart release
(``webhook.stack.chartvalues``); ``drivers/`` renders with the real ``kubectl kustomize`` into
objects that validate (``webhook.stack.manifestcheck``); and, when helm is at hand, the real chart
of the target release renders with the staged values into objects that mean what stack.yaml says
(``webhook.stack.chartrender`` + ``chartcheck``). NVIDIADriver objects are checked against the
v26.7.0 CRD (``nvidia.com_nvidiadrivers.yaml``) made strict, because the datree JSON schema is
from 26.3.3 and lacks ``spec.default`` and ``spec.upgradePolicy``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook.errors import GpugateError
from webhook.kube.yamlload import fast_load
from webhook.stack.compat import Check
from webhook.stack.manifests import DRIVERS_DIR, VALUES_FILE
from webhook.stack.model import Stack
from webhook.stack.releases import OperatorVersion

NVIDIADRIVER_CRD_FILE = "nvidia.com_nvidiadrivers.yaml"


def default_schema_root(repo: Path) -> Path:
    """``<repo>/../shared/schemas``: where the project keeps the upstream CRDs beside the checkout."""
    return repo.resolve().parent / "shared" / "schemas"


def values_keys(values: Mapping[str, Any], release: OperatorVersion) -> Check:
    """Every key of values.yaml must exist in the target chart release's values.yaml."""
    try:
        from webhook.stack import chartvalues
    except ImportError as err:
        return Check(name="values-keys", ok=False, reason=f"the values-key check is not available ({err})")
    known = chartvalues.known_releases()
    wanted = str(release)
    note = ""
    if wanted not in known:
        same_line = [r for r in known if OperatorVersion.parse(r).line == release.line]
        if not same_line:
            return Check(name="values-keys", ok=True, reason=f"no key list for {wanted} or its release line",
                         warning=f"values.yaml keys not checked: no key list for {wanted} ({', '.join(known)} known)")
        wanted = max(same_line, key=OperatorVersion.parse)
        note = f" (key list of {wanted}, the nearest release of line {release.line_name})"
    unknown = chartvalues.unknown_keys(dict(values), wanted)
    if unknown:
        return Check(name="values-keys", ok=False,
                     reason=f"{VALUES_FILE} has key(s) the {wanted} chart does not: {', '.join(unknown)}{note}")
    return Check(name="values-keys", ok=True, reason=f"every key of {VALUES_FILE} exists in chart {wanted}{note}")


def strict_crd_schema(crd: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The openAPIV3Schema of ``version`` as JSON Schema, strict like kubeconform's openapi2jsonschema:
    unknown fields are refused at every level (the API server would prune them silently, which is
    exactly the typo to catch), int-or-string accepts both, nullable admits null, and metadata is
    left to the API server."""
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            schema = _strict(json.loads(json.dumps(served["schema"]["openAPIV3Schema"])))
            schema.setdefault("properties", {})["metadata"] = {"type": "object"}
            return schema
    raise GpugateError(f"CRD {crd['metadata']['name']} has no version {version}")


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        if node.get("x-kubernetes-int-or-string"):
            node.pop("type", None)
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if node.get("nullable") and "type" in node:
            node["type"] = [node["type"], "null"]
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)
    return node


@dataclass(frozen=True, kw_only=True)
class ChartSettings:
    """How to render the real chart before a commit; ``helm`` None means "not available: skip, and say so"."""

    helm: Path | None
    repo_url: str
    """The Helm repository Argo CD pulls the chart from (argocd/site/site.yaml chartRepoURL)."""
    skip_reason: str = ""
    """Set when the render is skipped on purpose (--skip-chart-render) or for lack of helm."""


def _render_driver_objects(files: Mapping[str, bytes | None]) -> list[dict[str, Any]]:
    from webhook.stack import manifestcheck

    with tempfile.TemporaryDirectory(prefix="gpugate-stack-") as tmp:
        root = Path(tmp)
        for rel, content in files.items():
            if rel.startswith(DRIVERS_DIR + "/") and content is not None:
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
        return manifestcheck.kustomize(root / DRIVERS_DIR)


def rendered_drivers(files: Mapping[str, bytes | None], *, kubernetes_minor: int,
                     schema_root: Path | None, need_validator: bool = True) -> list[Check]:
    """Render the staged ``drivers/`` with kubectl kustomize and validate every object.

    The validation needs kubernetes-validate (the ``stack`` extra). Without it the check fails
    when ``need_validator`` (a commit), and is shown skipped, with the install command, otherwise
    (a plan that only prints what it would do).
    """
    from webhook.stack import manifestcheck

    checks: list[Check] = []
    try:
        objects = _render_driver_objects(files)
    except GpugateError as err:
        return [Check(name="drivers-render", ok=False, reason=str(err))]
    checks.append(Check(name="drivers-render", ok=True,
                        reason=f"kubectl kustomize {DRIVERS_DIR} renders {len(objects)} object(s)"))
    with tempfile.TemporaryDirectory(prefix="gpugate-schemas-") as tmp:
        crd_file = schema_root / NVIDIADRIVER_CRD_FILE if schema_root is not None else None
        derived_root: Path | None = None
        warning = ""
        if crd_file is not None and crd_file.is_file():
            crd = fast_load(crd_file.read_text(encoding="utf-8"))
            derived_root = Path(tmp)
            target = derived_root / "json" / "nvidia.com" / "nvidiadriver_v1alpha1.json"
            target.parent.mkdir(parents=True)
            target.write_text(json.dumps(strict_crd_schema(crd, "v1alpha1")))
        elif any(o.get("kind") == "NVIDIADriver" for o in objects):
            where = f"under {schema_root}" if schema_root is not None else "given (../shared/schemas is absent)"
            warning = (f"NVIDIADriver objects checked against the built-in rules only: no {NVIDIADRIVER_CRD_FILE} "
                       f"{where}; pass --schemas DIR holding the GPU Operator release's CRDs to validate them strictly")
        try:
            problems = manifestcheck.validate_objects(objects, kubernetes_version=f"1.{kubernetes_minor}",
                                                      schema_root=derived_root)
        except manifestcheck.ValidatorMissing:
            if need_validator:
                return checks + [Check(name="drivers-valid", ok=False,
                                       reason=f"kubernetes-validate is not installed, and a stack commit validates "
                                              f"every NVIDIADriver first: {manifestcheck.INSTALL_VALIDATOR}; "
                                              f"`gpugate stack plan` runs without it")]
            return checks + [Check(name="drivers-valid", ok=True, skipped=True,
                                   reason=f"skipped: kubernetes-validate is not installed; "
                                          f"{manifestcheck.INSTALL_VALIDATOR} (upgrade, promote, sync and "
                                          f"rollback need it)")]
        except GpugateError as err:
            return checks + [Check(name="drivers-valid", ok=False, reason=str(err))]
    if problems:
        checks.append(Check(name="drivers-valid", ok=False, reason="; ".join(problems)))
    else:
        against = f"the CRD {NVIDIADRIVER_CRD_FILE}" if derived_root else "built-in schemas only"
        checks.append(Check(name="drivers-valid", ok=True, warning=warning,
                            reason=f"{len(objects)} object(s) validate strictly against {against}"))
    return checks


def rendered_chart(files: Mapping[str, bytes | None], *, stack: Stack, chart: ChartSettings) -> list[Check]:
    """Render the target chart release with the staged values, as Argo CD will, and check what it says."""
    from webhook.stack import chartcheck, chartrender

    if chart.helm is None:
        # The way to render it is said once, here; the warning (also in the commit) only says what was missed.
        run_it = ("drop --skip-chart-render" if chart.skip_reason == "--skip-chart-render"
                  else "give helm with --helm PATH or $GPUGATE_HELM, or put it on PATH")
        return [Check(name="chart-render", ok=True, skipped=True,
                      reason=f"not rendered: {chart.skip_reason}; to render it, {run_it}",
                      warning=f"the {stack.chart} {stack.operator_version} chart was not rendered, so its "
                              f"ClusterPolicy was not checked against stack.yaml")]
    source = chartrender.ChartSource(repo_url=chart.repo_url, chart=stack.chart, version=str(stack.operator_version))
    values = files.get(VALUES_FILE) or b""
    try:
        objects = chartrender.render(chart.helm, source, values=values, kube_version=f"1.{stack.kubernetes_minor}")
        drivers = _render_driver_objects(files) if stack.management == "nvidiadriver" else []
    except GpugateError as err:
        reason = str(err)
        if "://" in chart.repo_url and not chart.repo_url.startswith("file://"):
            reason += (f". If {chart.repo_url} cannot be reached from here, render from a folder of chart packages "
                       f"with --chart-repo file:///PATH (or ${chartrender.CHART_REPO_ENV}), or leave the render out "
                       f"with --skip-chart-render")
        return [Check(name="chart-render", ok=False, reason=reason)]
    checks = [Check(name="chart-render", ok=True,
                    reason=f"helm template {source} renders {len(objects)} object(s) with the staged values")]
    return checks + chartcheck.check_rendered_chart(objects, stack, drivers)


def staged(files: Mapping[str, bytes | None], *, release: OperatorVersion, kubernetes_minor: int,
           schema_root: Path | None, stack: Stack | None = None,
           chart: ChartSettings | None = None, need_validator: bool = True) -> tuple[Check, ...]:
    """All re-validation checks for a complete set of files (current files overlaid with the change).

    With ``chart`` (and the ``stack`` the files declare) the real chart is rendered too.
    ``need_validator`` False (a plan that commits nothing) shows the schema check skipped when
    kubernetes-validate is not installed, instead of failing it.
    """
    values = files.get(VALUES_FILE)
    checks = [values_keys(fast_load(values) or {} if values else {}, release)]
    checks += rendered_drivers(files, kubernetes_minor=kubernetes_minor, schema_root=schema_root,
                               need_validator=need_validator)
    if chart is not None and stack is not None:
        checks += rendered_chart(files, stack=stack, chart=chart)
    return tuple(checks)
