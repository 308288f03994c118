"""Fuzz the served webhook with mutated admission reviews: count 5xx answers and wrong allows.

The long run of ``tests/admission/test_fuzz_enforcement.py``, with the same generator and oracle
(``tests/admission/enforcefuzz.py``): a real ``gpugate serve --fail-closed`` (gunicorn, TLS, the
repository's policies) answers every review; it prints the counts and exits 1 on any 5xx,
malformed answer or wrong allow (the first ones are written to ``--out``).

    python benchmarks/fuzz_admission.py [--reviews 20000] [--seed 42] [--out wrong-allows.json]

Needs the test extra (``pip install -e '.[test]'``: requests).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def fuzz(reviews: int, seed: int) -> Any:
    """Start the server in a fresh folder, send the reviews, stop it; the fuzz's report."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.admission import enforcefuzz
    from tests.server.harness import Server, copy_policies

    with tempfile.TemporaryDirectory(prefix="gpugate-fuzz-") as tmp:
        server = Server(Path(tmp), policies=copy_policies(Path(tmp) / "policies"), extra=["--fail-closed"]).start()
        try:
            return enforcefuzz.Fuzz(lambda endpoint, body: server.session.post(
                f"{server.url}/{endpoint}", data=body, headers={"Content-Type": "application/json"}, timeout=30),
                seed=seed).run(reviews)
        finally:
            server.stop()


def main() -> None:
    if importlib.util.find_spec("requests") is None:
        sys.exit("benchmarks/fuzz_admission.py needs the test extra: pip install -e '.[test]'")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=Path("wrong-allows.json"))
    args = parser.parse_args()
    report = fuzz(args.reviews, args.seed)
    print(f"fuzz_admission --reviews {args.reviews} --seed {args.seed}: {report.summary()}")
    if report.wrong_allows or report.malformed:
        args.out.write_text(json.dumps({"wrong_allows": report.wrong_allows[:20], "malformed": report.malformed[:20]},
                                       indent=1))
        print(f"the first ones are in {args.out}")
    sys.exit(1 if report.wrong_allows or report.malformed or report.server_errors else 0)


if __name__ == "__main__":
    main()
