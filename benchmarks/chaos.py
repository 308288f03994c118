"""Ten minutes of steady load on ``gpugate serve`` through everything that happens to a webhook pod.

The long run of ``tests/server/test_lifecycle.py::test_chaos_minute``, with the same driver
(``tests/server/chaos.py``): policy edits, an invalid policy, certificate rotations, SIGTERM to a
worker, SIGHUP to the master and SIGKILL to a worker, in turn, under kept-alive load. It prints the
counts; only requests in flight on a killed worker may fail.

    python benchmarks/chaos.py [--minutes 10] [--clients 6]

Needs the test extra (``pip install -e '.[test]'``: requests).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

try:
    import requests  # noqa: F401
except ImportError:
    sys.exit("benchmarks/chaos.py needs the test extra: pip install -e '.[test]'")

from tests.server.chaos import Chaos  # noqa: E402
from tests.server.harness import ConfigMapVolume, Server, repo_policies  # noqa: E402
from webhook.certs import pki  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpugate-chaos-") as tmp:
        root = Path(tmp)
        tls = root / "tls"
        pki.write_bundle(pki.create_bundle(service="gpugate-webhook", namespace="gpugate-system",
                                           now=datetime.now(UTC)), tls)
        volume = ConfigMapVolume(root / "policies")
        volume.publish(repo_policies())
        server = Server(root, policies=volume.root,
                        extra=["--cert", str(tls / pki.CERT_FILE), "--key", str(tls / pki.KEY_FILE),
                               "--drain-seconds", "1"]).start(ca=tls / pki.CA_CERT_FILE)
        started = time.monotonic()
        try:
            report = Chaos(server, volume, tls, clients=args.clients).run(
                args.minutes * 60, on_event=lambda name: print(f"+{time.monotonic() - started:7.1f}s {name}",
                                                               flush=True))
            alive = server.process is not None and server.process.poll() is None
        finally:
            server.stop()
    print(f"\nchaos, {args.minutes:g} min, {args.clients} kept-alive clients; server alive at the end: {alive}")
    print(report.summary())
    sys.exit(0 if alive and not report.unexcused_failures() else 1)


if __name__ == "__main__":
    main()
