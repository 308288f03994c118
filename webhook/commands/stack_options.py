"""The options the ``gpugate stack`` commands share, and the few helpers that read them.

``waiver_options`` turns the ``--allow-...`` flags into one ``Waivers`` value: a command takes
``waivers`` and hands it on whole, never flag by flag.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from webhook.commands.clusteroptions import target_options
from webhook.errors import GpugateError
from webhook.kubetarget import Target
from webhook.stack import plan as planning
from webhook.stack import releases, verify
from webhook.stack import upgrade as stack_upgrade
from webhook.stack.checks import Waivers
from webhook.stack.gitrepo import Repo

_MODES = click.Choice(["nvidiadriver", "clusterpolicy"])


def repo_option(func: Any) -> Any:
    return click.option("--repo", "repo", type=click.Path(exists=True, file_okay=False, path_type=Path),
                        default=Path("."), show_default=True,
                        help="Root (or any folder) of the git repository holding manifests/gpu-operator.")(func)


def output_option(func: Any) -> Any:
    return click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
                        help="text for people, json for machines.")(func)


def schemas_option(func: Any) -> Any:
    return click.option("--schemas", "schemas", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help="Folder with nvidia.com_nvidiadrivers.yaml (default: <repo>/../shared/schemas).")(func)


def form(parse: Any) -> Any:
    """A click callback that refuses a malformed value as a usage error (exit 2), with the expected form."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                parse(value)
            except GpugateError as err:
                raise click.BadParameter(str(err)) from err
        return value

    return callback


WAIVER_FLAGS: dict[str, tuple[str, str]] = {
    "unvalidated_driver": ("--allow-unvalidated-driver",
                           "Accept a driver outside the target's validated branches (warned)."),
    "unlisted_driver": ("--allow-unlisted-driver",
                        "Accept a driver version not in the list of published driver images (said in the commit)."),
    "driver_downgrade": ("--allow-driver-downgrade",
                         "Accept moving a pool to an older driver (the commit is titled a downgrade and says so)."),
    "operator_downgrade": ("--allow-operator-downgrade",
                           "Accept a rollback that lowers the GPU Operator (and, through Argo CD, its CRDs)."),
}
"""``Waivers`` field -> its flag and help: one home for what each ``--allow-...`` means."""


def waiver_options(*fields: str) -> Any:
    """The ``--allow-...`` flags of ``fields``, handed to the command as one ``waivers: Waivers``."""

    def decorate(func: Any) -> Any:
        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            kwargs["waivers"] = Waivers(**{name: kwargs.pop(f"allow_{name}") for name in fields})
            return func(*args, **kwargs)

        for name in reversed(fields):
            flag, text = WAIVER_FLAGS[name]
            command = click.option(flag, f"allow_{name}", is_flag=True, help=text)(command)
        return command

    return decorate


def change_options(func: Any) -> Any:
    """--operator, --driver, --pool, --kubernetes, the driver waivers and --driver-management, handed to
    the command as one ``request: plan.Request``."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        kwargs["request"] = planning.Request(
            operator=kwargs.pop("operator"), driver=kwargs.pop("driver"), pool=kwargs.pop("pool"),
            kubernetes=kwargs.pop("kubernetes"), waivers=kwargs.pop("waivers"),
            driver_management=kwargs.pop("driver_management"))
        return func(*args, **kwargs)

    options = [
        click.option("--operator", required=True, callback=form(releases.OperatorVersion.parse),
                     help="Target GPU Operator release, e.g. v26.7.0."),
        click.option("--driver", default=None, callback=form(releases.driver_branch),
                     help="Target driver version (default: keep each pool's)."),
        click.option("--pool", default=None, help="Change only this pool's NVIDIADriver (canary)."),
        click.option("--kubernetes", default=None, callback=form(releases.parse_minor),
                     help="The cluster's Kubernetes minor, 1.NN (default: stack.yaml)."),
        waiver_options("unvalidated_driver", "unlisted_driver", "driver_downgrade"),
        click.option("--driver-management", type=_MODES, default=None,
                     help="Move the driver to NVIDIADriver CRs per pool, or back to the ClusterPolicy."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def chart_options(func: Any) -> Any:
    """How the real chart is rendered before a commit (the check is skipped, and says so, without helm)."""
    func = click.option("--skip-chart-render", is_flag=True, envvar="GPUGATE_SKIP_CHART_RENDER",
                        help="Do not render the chart (e.g. offline); the commit says it was not checked.")(func)
    func = click.option("--chart-repo", default=None,
                        help="Helm repository to render the chart from (default: $GPUGATE_CHART_REPO, else "
                             "chartRepoURL in argocd/site/site.yaml).")(func)
    return click.option("--helm", "helm", default=None,
                        help="helm binary for the chart render (default: $GPUGATE_HELM, else helm on PATH).")(func)


def cluster_option(func: Any) -> Any:
    """--kube / --server / --cluster-state, handed to the command as one ``cluster`` reader (None: not asked)."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        kube, server, recorded = kwargs.pop("kube"), kwargs.pop("server"), kwargs.pop("cluster_state")
        if recorded is not None and (kube or server.given):
            raise click.UsageError("--cluster-state reads a recording: pass it without --kube/--server")
        kwargs["cluster"] = cluster_reader(kube or server.given, server, recorded)
        return func(*args, **kwargs)

    decorated: Any = click.option(
        "--cluster-state", "cluster_state", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Read the cluster from a recording (YAML objects or Lists, e.g. `kubectl get "
             "crd,nodes,pods,daemonsets -A -o yaml`) instead of the API.")(command)
    decorated = target_options("API server URL for --kube (default: in-cluster or kubeconfig).")(decorated)
    return click.option("--kube", is_flag=True,
                        help="Read the cluster for the preflight rules (CRDs as served, GPU nodes, pods, "
                             "DaemonSets, NVIDIA objects).")(decorated)


def cluster_reader(kube: bool, server: Target, recorded: Path | None) -> stack_upgrade.ClusterReader | None:
    """What reads the cluster when the plan needs it, or None when no cluster was asked for."""
    from webhook.stack import clusterread

    if recorded is not None:
        return lambda: clusterread.load_recorded(recorded)
    if kube:
        return lambda: clusterread.read_cluster(server)
    return None


def root_of(path: Path) -> Path:
    try:
        return Repo(path).root
    except GpugateError:
        return path.resolve()


def schema_root_of(root: Path, schemas: Path | None) -> Path | None:
    if schemas is not None:
        return schemas
    default = verify.default_schema_root(root)
    return default if default.is_dir() else None


@dataclass(frozen=True)
class Workspace:
    """Where a stack command works: the repository, the schemas it validates with, how it renders the chart."""

    root: Path
    schemas: Path | None
    helm: str | None
    chart_repo: str | None
    skip_chart_render: bool

    @property
    def schema_root(self) -> Path | None:
        return schema_root_of(self.root, self.schemas)

    def chart(self) -> verify.ChartSettings:
        return stack_upgrade.chart_settings(self.root, helm=self.helm, chart_repo=self.chart_repo,
                                            skip=self.skip_chart_render)

    def clean_repo(self, *, allow: tuple[str, ...] = ()) -> Repo:
        """The repository, refused when the stack's files have uncommitted changes (but ``allow``)."""
        repo = Repo(self.root)
        repo.require_clean(stack_upgrade.STACK_PATHS, allow=allow)
        return repo


def workspace_options(func: Any) -> Any:
    """The chart options, --repo and --schemas, handed to the command as one ``where: Workspace``."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        kwargs["where"] = Workspace(root=root_of(kwargs.pop("repo")), schemas=kwargs.pop("schemas"),
                                    helm=kwargs.pop("helm"), chart_repo=kwargs.pop("chart_repo"),
                                    skip_chart_render=kwargs.pop("skip_chart_render"))
        return func(*args, **kwargs)

    return chart_options(repo_option(schemas_option(command)))
