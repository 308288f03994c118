"""Mutated reviews against the served webhook (gunicorn, TLS): no 5xx, no wrong allow (short run).

``tests/admission/enforcefuzz.py`` says what is mutated and what the oracle, written apart from
gpugate's core, calls a review no starter policy may allow. The long run is
``python benchmarks/fuzz_admission.py --reviews 20000`` (docs/dra.md quotes its figure).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.admission import enforcefuzz
from tests.server.harness import Server, copy_policies

REVIEWS = 400


@pytest.fixture(scope="module")
def closed_server(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("fuzz-enforcement")
    server = Server(workdir, policies=copy_policies(workdir / "policies"), extra=["--fail-closed"]).start()
    yield server
    server.stop()


def test_the_oracle_calls_the_forbidden_seeds_forbidden_and_the_others_not() -> None:
    verdicts = {(ns, p["metadata"]["name"]): enforcefuzz.must_deny(enforcefuzz.review(ns, p))
                for ns, p in enforcefuzz.seeds()}
    assert all(v for (ns, name), v in verdicts.items() if ns in enforcefuzz.WEB)
    assert all(verdicts[(ns, name)] for ns in enforcefuzz.ML for name in ("trainer", "big", "accel"))
    assert not any(verdicts[(ns, name)] for ns in enforcefuzz.ML for name in ("ok", "cpu"))


def test_mutations_keep_many_reviews_forbidden_and_some_allowed() -> None:
    """The fuzz must test something: a good share of its reviews stay forbidden, and some are not."""
    rng = random.Random(7)
    verdicts = [enforcefuzz.must_deny(enforcefuzz.mutated(rng, enforcefuzz.seeds())[0]) for _ in range(500)]
    assert 200 < sum(verdicts) < 480


def test_mutated_reviews_get_no_5xx_no_malformed_answer_and_no_wrong_allow(closed_server: Server,
                                                                          tmp_path: Path) -> None:
    def post(endpoint: str, body: bytes):
        return closed_server.session.post(f"{closed_server.url}/{endpoint}", data=body,
                                          headers={"Content-Type": "application/json"}, timeout=30)

    report = enforcefuzz.Fuzz(post, seed=1).run(REVIEWS)
    (tmp_path / "wrong-allows.json").write_text(json.dumps(report.wrong_allows[:5], indent=1))
    assert report.sent == REVIEWS and report.must_deny > REVIEWS // 4, report.summary()
    assert report.server_errors == 0 and not report.malformed, (report.summary(), report.malformed[:3])
    assert not report.wrong_allows, (report.summary(), json.dumps(report.wrong_allows[0])[:3000])
