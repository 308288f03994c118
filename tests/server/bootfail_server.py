"""``gpugate serve``'s machinery around an app whose boot fails on demand (lifecycle tests only).

Each file in ``--fail-tokens`` makes one worker's app factory raise; the worker that removes a
token (os.unlink is atomic, so each token fails exactly one boot) raises, the others boot.
Run as ``python -m tests.server.bootfail_server --bind HOST:PORT --cert C --key K --policies P --fail-tokens D``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from webhook.commands.serve import run_gunicorn


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--bind", "--cert", "--key", "--policies", "--fail-tokens"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    tokens = Path(args.fail_tokens)

    def make_app(runtime_dir: Path) -> Any:
        for token in sorted(tokens.iterdir()):
            try:
                os.unlink(token)
            except FileNotFoundError:
                continue  # a sibling took it
            raise RuntimeError(f"boot failure injected by the test ({token.name})")
        from webhook.server import routes

        return routes.create_app(routes.ServerSettings(policy_dir=Path(args.policies),
                                                       snapshot_dir=runtime_dir / "policies"))

    run_gunicorn(make_app, bind=args.bind, workers=2, threads=2, certfile=Path(args.cert), keyfile=Path(args.key),
                 drain_seconds=0.5)


if __name__ == "__main__":
    main()
