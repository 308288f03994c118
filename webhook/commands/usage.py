"""``gpugate usage``: GPU-hours per namespace and owner from Prometheus, and the idle allocations found."""

from __future__ import annotations

import click

from webhook import durations
from webhook.errors import GpugateError
from webhook.usage import report


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> int:
    try:
        return durations.seconds(value)
    except durations.DurationError as err:
        raise click.BadParameter(str(err)) from err


@click.command("usage")
@click.option("--prometheus", metavar="URL", required=True,
              help="Prometheus base URL; it must load the gpugate-usage recording rules and scrape the balancer "
              "(run with --usage).")
@click.option("--since", default="24h", show_default=True, callback=_duration,
              help="The window: GPU-hours of the last DURATION (90m, 24h, 7d).")
@click.option("--step", default="1m", show_default=True, callback=_duration,
              help="How often the recorded series are sampled over the window (the rules' interval).")
@click.option("--idle", "idle_only", is_flag=True,
              help="List the idle allocations the balancer found at its last look instead.")
@click.option("-o", "--output", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds per query.")
def usage(prometheus: str, since: int, step: int, idle_only: bool, output: str, timeout: float) -> None:
    """GPU-hours allocated, used and idle per namespace and owner over a window.

    Whole GPUs, MIG slices, time-sliced slots and DRA shares count as their share of a physical
    GPU; used is DCGM activity times allocation. The last lines check that allocated plus
    unallocated GPU-hours are the physical ones (within 1 %). With --idle: one line per pod whose
    GPUs stayed under its policy's activity threshold for its policy's time.
    """
    from webhook.balancer.prometheus import PrometheusClient, PrometheusError

    client = PrometheusClient(prometheus, window="1m", timeout=timeout)
    queries = report.idle_queries() if idle_only else report.usage_queries(report.Window(since, step))
    try:
        answers = {name: client.query(expr) for name, expr in queries.items()}
        if idle_only:
            lines = report.idle_from(answers)
            click.echo({"table": report.idle_table, "json": report.idle_json, "csv": report.idle_csv}[output](lines),
                       nl=output != "csv")
            return
        found = report.usage_from(answers, since=durations.text(since))
    except (PrometheusError, ValueError) as err:
        raise GpugateError(f"{prometheus}: {err}") from err
    click.echo({"table": report.table, "json": report.as_json, "csv": report.as_csv}[output](found),
               nl=output != "csv")
