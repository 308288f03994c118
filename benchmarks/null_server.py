"""The benchmark's baseline: ``gpugate serve`` with every part but the policy core.

Same gunicorn master, worker, TLS, Flask routes, review decoding and encoding, metrics and JSON log
line as the real server; the core is a stub that allows every pod unchanged. What the real server
costs beyond this is what the policy core costs.

    python benchmarks/null_server.py --bind 127.0.0.1:PORT --cert C --key K --workers 2 --threads 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from webhook.commands.serve import run_gunicorn  # noqa: E402


class NullCore:
    """Allows every pod unchanged: no policy matching, no patch."""

    def mutate(self, pod: dict[str, Any], *, namespace: str, policies: Any, inventory: Any, now: Any) -> Any:
        from webhook.admission.mutation import Mutation

        return Mutation(desired=pod, patch=(), policy=None)

    def validate(self, pod: dict[str, Any], *, namespace: str, policies: Any, inventory: Any, now: Any) -> Any:
        from webhook.admission.validation import Verdict

        return Verdict(allowed=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True)
    parser.add_argument("--cert", required=True, type=Path)
    parser.add_argument("--key", required=True, type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--metrics-port", type=int, help="serve /metrics on 127.0.0.1:PORT (plain HTTP)")
    args = parser.parse_args()

    def make_app(runtime_dir: Path) -> Any:
        from webhook.server import routes

        settings = routes.ServerSettings(policy_dir=REPO / "policies", reload_interval=0,
                                         snapshot_dir=runtime_dir / "policies")
        return routes.create_app(settings, core=NullCore())

    run_gunicorn(make_app, bind=args.bind, workers=args.workers, threads=args.threads, certfile=args.cert,
                 keyfile=args.key, drain_seconds=0.2,
                 metrics_bind=("127.0.0.1", args.metrics_port) if args.metrics_port else None)


if __name__ == "__main__":
    main()
