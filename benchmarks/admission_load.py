"""Load benchmark of ``gpugate serve``: HTTPS with keep-alive, fixed 500 req/s, then as fast as it goes.

Runs two servers in one go: the null webhook (``benchmarks/null_server.py``: the same master,
workers, TLS, routes, decoding, encoding, metrics and log line, with a policy core that allows
everything unchanged) and gpugate with the repository's policies, and prints both side by side,
with each worker's share of the requests. The load comes from separate driver processes
(threads, one kept-alive TLS connection each, requests pre-encoded so the client spends little
CPU per request). Latency at a fixed rate is measured from the *scheduled* send time, so a stall
counts against every request queued behind it (no coordinated omission).

Every request is ``POST /mutate``. By default the review is a realistic one
(``benchmarks/realistic_review.py``: an 8-GPU training worker with a sidecar, env, a projected
service-account volume and managedFields, about 5.9 KB, as the API server sends it);
``--small`` uses the bundled example pod (webhook/examples/pod-training.yaml, about 1 KB).

    python benchmarks/admission_load.py [--seconds 5] [--rate 500] [--connections 8] [--drivers 2]
        [--rounds 5] [--before REV] [--small]
    python benchmarks/admission_load.py --profile   # where the app's CPU goes (in-process cProfile)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import orjson  # noqa: E402
import yaml  # noqa: E402

from benchmarks import realistic_review  # noqa: E402
from webhook.admission import reviews  # noqa: E402
from webhook.certs import pki  # noqa: E402
from webhook.policy import loading  # noqa: E402

SERVICE_HOST = "gpugate-webhook.gpugate-system.svc"


# --- the server under test ---------------------------------------------------------------------


def ratio(numerator: float, denominator: float) -> str:
    """``numerator / denominator`` to two places, or ``n/a`` when nothing was measured below it.

    A phase that got no answer in its seconds (a very short run on a loaded machine) has 0 req/s;
    the table says so instead of dividing by zero after the whole run.
    """
    return f"{numerator / denominator:.2f}" if denominator else "n/a"

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerUnderTest:
    def __init__(self, workdir: Path, *, null: bool, workers: int, threads: int, code: Path = REPO) -> None:
        """``code``: the checkout whose gpugate (and policies) this server runs (``--before``: an older one)."""
        self.port = free_port()
        self.state = workdir / "state"
        pki.write_bundle(pki.create_bundle(service="gpugate-webhook", namespace="gpugate-system",
                                           now=datetime.now(UTC)), self.state)
        tls = ["--cert", str(self.state / pki.CERT_FILE), "--key", str(self.state / pki.KEY_FILE)]
        sizing = ["--workers", str(workers), "--threads", str(threads)]
        if null:
            args = [sys.executable, str(REPO / "benchmarks" / "null_server.py"),
                    "--bind", f"127.0.0.1:{self.port}", *tls, *sizing]
        else:
            args = [sys.executable, "-m", "webhook.cli", "serve", "--bind", f"127.0.0.1:{self.port}",
                    "--policies", str(code / "policies"), *tls, *sizing]
        self.log_path = workdir / f"server-{'null' if null else 'gpugate'}.log"
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        if code != REPO:
            env["PYTHONPATH"] = str(code)  # ahead of the editable install, which is this checkout
        self.log = open(self.log_path, "wb")
        # Admission log lines go to a file as they would to a container log.
        self.process = subprocess.Popen(args, cwd=workdir, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        self.ca = self.state / "ca.crt"
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"server exited: {(workdir / 'server.log')}")
            if self.ca.exists() and self._ready():
                break
            if time.monotonic() > deadline:
                raise SystemExit("server did not become ready")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            conn = Connection("127.0.0.1", self.port, str(self.ca))
            status, _ = conn.request(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            conn.close()
            return status == 200
        except OSError:
            return False

    def worker_pids(self) -> list[int]:
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.process.pid:
                    pids.append(int(entry))
        return sorted(pids)

    def rss_mib(self) -> list[float]:
        out = []
        for pid in self.worker_pids():
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out.append(int(line.split()[1]) / 1024)
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU time of all workers so far (clock ticks from /proc/<pid>/stat)."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self.worker_pids():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / ticks

    def shares(self) -> dict[int, int]:
        """Requests answered per worker pid, from the admission log lines."""
        counts: dict[int, int] = {}
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"event":"admission"' in line:
                pid = json.loads(line)["pid"]
                counts[pid] = counts.get(pid, 0) + 1
        return counts

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()


# --- the client ----------------------------------------------------------------------------------

class Connection:
    """One kept-alive TLS connection speaking just enough HTTP/1.1 (Content-Length bodies)."""

    def __init__(self, host: str, port: int, ca: str) -> None:
        context = ssl.create_default_context(cafile=ca)
        raw = socket.create_connection((host, port), timeout=10)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = context.wrap_socket(raw, server_hostname=SERVICE_HOST)
        self.buffer = b""

    def request(self, data: bytes) -> tuple[int, bytes]:
        self.sock.sendall(data)
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buffer += chunk
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection mid-body")
            rest += chunk
        body, self.buffer = rest[:length], rest[length:]
        return status, body

    def close(self) -> None:
        self.sock.close()


def encoded_requests(n: int, small: bool = False) -> list[bytes]:
    pod = yaml.safe_load((REPO / "webhook" / "examples" / "pod-training.yaml").read_text())
    out = []
    for _ in range(n):
        document = (reviews.wrap_pod(pod, uid=str(uuid.uuid4()), namespace="ml-vision") if small
                    else realistic_review.review())
        body = json.dumps(document).encode()
        out.append(b"POST /mutate HTTP/1.1\r\nHost: " + SERVICE_HOST.encode()
                   + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
                   + b"\r\n\r\n" + body)
    return out


def drive(port: int, ca: str, connections: int, seconds: float, rate: float | None, start_at: float,
          queue: Any, small: bool) -> None:
    """One driver process: ``connections`` threads; fixed total ``rate`` per process, or closed loop."""
    payloads = encoded_requests(64, small)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        local_lat: list[float] = []
        local_err: list[str] = []
        try:
            conn = Connection("127.0.0.1", port, ca)
        except OSError as err:
            with lock:
                errors.append(f"connect: {err}")
            return
        interval = connections / rate if rate else 0.0
        # Stagger the connections over one interval so the fixed rate is smooth.
        next_at = start_at + (index * interval / connections if rate else 0.0)
        end = start_at + seconds
        i = index
        while True:
            if rate:
                now = time.perf_counter()
                if next_at > end:
                    break
                if next_at > now:
                    time.sleep(next_at - now)
                scheduled = next_at
                next_at += interval
            else:
                scheduled = time.perf_counter()
                if scheduled > end:
                    break
            try:
                status, body = conn.request(payloads[i % len(payloads)])
                done = time.perf_counter()
                if status != 200 or b'"allowed":true' not in body:
                    local_err.append(f"HTTP {status}: {body[:120]!r}")
                else:
                    local_lat.append(done - scheduled)
            except (OSError, ValueError) as err:
                local_err.append(f"{type(err).__name__}: {err}")
                try:
                    conn = Connection("127.0.0.1", port, ca)
                except OSError:
                    pass
            i += connections
        conn.close()
        with lock:
            latencies.extend(local_lat)
            errors.extend(local_err)

    while time.perf_counter() < start_at - 0.5:
        time.sleep(0.05)
    threads = [threading.Thread(target=run, args=(k,)) for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put((latencies, errors))


def load(server: ServerUnderTest, *, drivers: int, connections: int, seconds: float,
         rate: float | None, small: bool) -> dict[str, Any]:
    ctx = mp.get_context("spawn")   # fresh interpreters: nothing of this process is shared
    queue = ctx.Queue()
    # perf_counter is CLOCK_MONOTONIC on Linux: the same clock in every process of the machine.
    start_at = time.perf_counter() + 2.0
    per_driver_rate = rate / drivers if rate else None
    procs = [ctx.Process(target=drive, args=(server.port, str(server.ca), connections, seconds, per_driver_rate,
                                              start_at, queue, small)) for _ in range(drivers)]
    for p in procs:
        p.start()
    latencies: list[float] = []
    errors: list[str] = []
    for _ in procs:
        lat, err = queue.get(timeout=seconds + 60)
        latencies += lat
        errors += err
    for p in procs:
        p.join()
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")

    return {"rps": len(latencies) / seconds, "p50": pct(0.50), "p95": pct(0.95), "p99": pct(0.99),
            "errors": len(errors), "first_error": errors[0] if errors else "", "n": len(latencies)}


def progress(what: str, done: int, total: int) -> None:
    """One line on stderr per phase, so a run of minutes is not silent (stdout keeps the figures)."""
    print(f"admission_load [{done + 1}/{total}] {what}", file=sys.stderr, flush=True)


def measure(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The servers run side by side; the max-load phase alternates between them for ``--rounds``
    rounds (the order rotated each round), so a slow spell of this shared machine falls on all
    rather than on whichever went last. Each figure is the median over the rounds."""
    results: dict[str, dict[str, Any]] = {}
    run = {"drivers": args.drivers, "connections": args.connections, "small": args.small}
    with tempfile.TemporaryDirectory(prefix="gpugate-bench-") as tmp:
        servers: dict[str, ServerUnderTest] = {}
        kinds: list[tuple[str, bool, Path]] = [("null", True, REPO), ("gpugate", False, REPO)]
        if args.before:
            kinds.append(("before", False, checkout(args.before, Path(tmp) / "before-code")))
        try:
            for name, null, code in kinds:
                workdir = Path(tmp) / name
                workdir.mkdir()
                servers[name] = ServerUnderTest(workdir, null=null, workers=args.workers, threads=args.threads,
                                                code=code)
            phases = len(servers) * (1 + args.rounds)
            done = 0
            for name, server in servers.items():
                progress(f"{name}: warm-up, then {args.rate:.0f}/s for {args.seconds:g} s", done, phases)
                load(server, **run, seconds=1.0, rate=None)  # warm-up
                results[name] = {"fixed": load(server, **run, seconds=args.seconds, rate=args.rate), "rounds": []}
                done += 1
            names = list(servers)
            for round_ in range(args.rounds):
                # Rotated, not reversed: reversing three servers keeps one always in the middle, never
                # running right after itself as the ends do at round boundaries, and that cost it
                # 5-10% here. Rotated, each takes each place equally often.
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:
                    server = servers[name]
                    progress(f"{name}: max-load round {round_ + 1}/{args.rounds}, {args.seconds:g} s", done, phases)
                    done += 1
                    cpu_before = server.cpu_seconds()
                    peak = load(server, **run, seconds=args.seconds, rate=None)
                    # CPU the workers spent per answered review at max load: what capacity costs,
                    # less sensitive than req/s to other processes competing for the same cores.
                    peak["cpu_us"] = (server.cpu_seconds() - cpu_before) / max(peak["n"], 1) * 1e6
                    results[name]["rounds"].append(peak)
            for name, server in servers.items():
                rounds = results[name]["rounds"]
                results[name]["max"] = {key: statistics.median(r[key] for r in rounds)
                                        for key in ("rps", "p50", "p95", "p99", "cpu_us")}
                results[name]["max"]["errors"] = sum(r["errors"] for r in rounds)
                results[name]["max"]["first_error"] = next((r["first_error"] for r in rounds if r["first_error"]), "")
                results[name]["rss"] = server.rss_mib()
                results[name]["shares"] = server.shares()
        finally:
            for server in servers.values():
                server.stop()
            if args.before:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                str(Path(tmp) / "before-code")], capture_output=True)
    return results


def checkout(revision: str, where: Path) -> Path:
    """A detached worktree of this repository at ``revision``, for ``--before``."""
    done = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), revision],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"--before {revision}: {done.stderr.strip()}")
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--connections", type=int, default=8, help="connections per driver process")
    parser.add_argument("--drivers", type=int, default=2, help="driver processes")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="alternating max-load rounds per server (median)")
    parser.add_argument("--before", metavar="REV", help="also run gpugate at this git revision, in the same rounds")
    parser.add_argument("--profile", action="store_true", help="profile the app in-process, then exit")
    parser.add_argument("--small", action="store_true", help="the 1 KB example pod instead of the realistic review")
    args = parser.parse_args()
    if args.profile:
        profile_app(small=args.small)
        return

    results = measure(args)

    null, real = results["null"], results["gpugate"]
    cpu = os.cpu_count()
    load_avg = os.getloadavg()
    payload = "example pod, ~1 KB" if args.small else "realistic training-worker review, ~5.9 KB"
    print(f"\nadmission_load: POST /mutate ({payload}), {args.workers} workers x {args.threads} threads, "
          f"{args.drivers} drivers x {args.connections} keep-alive TLS connections, {args.seconds:.0f} s per phase, "
          f"max load in {args.rounds} alternating rounds (medians), "
          f"{cpu} CPUs shared by server and load (load average {load_avg[0]:.1f} at the end)\n")
    print(f"{'phase':<24}{'null webhook':>16}{'gpugate':>16}{'ratio':>9}")
    for phase, label in (("fixed", f"fixed {args.rate:.0f}/s"), ("max", "max")):
        a, b = null[phase], real[phase]
        print(f"{label + ' req/s':<24}{a['rps']:>16.0f}{b['rps']:>16.0f}{ratio(b['rps'], a['rps']):>9}")
        for q in ("p50", "p95", "p99"):
            print(f"{label + ' ' + q + ' ms':<24}{a[q]:>16.2f}{b[q]:>16.2f}{ratio(b[q], a[q]):>9}")
        print(f"{label + ' errors':<24}{a['errors']:>16}{b['errors']:>16}")
    per_round = "  ".join(ratio(b['rps'], a['rps']) for a, b in zip(null["rounds"], real["rounds"], strict=True))
    print(f"{'max req/s ratio by round':<24}  {per_round}")
    if "before" in results:
        old = results["before"]
        ratios = "  ".join(ratio(b['rps'], a['rps']) for a, b in zip(null["rounds"], old["rounds"], strict=True))
        old_rps, old_cpu = old["max"]["rps"], old["max"]["cpu_us"]
        print(f"{'before (' + args.before + ') max req/s':<24}{old_rps:>32.0f}{ratio(old_rps, null['max']['rps']):>9}"
              f"   gpugate/before {ratio(real['max']['rps'], old_rps)}")
        print(f"{'before ratio by round':<24}  {ratios}")
        print(f"{'before CPU us/review':<24}{old_cpu:>32.0f}{ratio(old_cpu, null['max']['cpu_us']):>9}")
    a_cpu, b_cpu = null["max"]["cpu_us"], real["max"]["cpu_us"]
    print(f"{'worker CPU us/review':<24}{a_cpu:>16.0f}{b_cpu:>16.0f}{ratio(b_cpu, a_cpu):>9}")
    print(f"{'RSS per worker MiB':<24}{' / '.join(f'{r:.0f}' for r in null['rss']):>16}"
          f"{' / '.join(f'{r:.0f}' for r in real['rss']):>16}")
    for name, res in results.items():
        total = sum(res["shares"].values()) or 1
        shares = " / ".join(f"{count / total:.0%}" for count in sorted(res["shares"].values(), reverse=True))
        print(f"{'share per worker (' + name + ')':<24}{shares:>32}")
    for name, res in results.items():
        for phase in ("fixed", "max"):
            if res[phase]["first_error"]:
                print(f"first error ({name}, {phase}): {res[phase]['first_error']}")
    least = min((c / max(sum(real["shares"].values()), 1) for c in real["shares"].values()), default=0.0)
    print("\ngoals: max >= 2000/s: {}; p99 at {:.0f}/s <= 10 ms: {}; max >= 0.7x null: {}; "
          "each worker >= 35% of requests: {}".format(
              "met" if real["max"]["rps"] >= 2000 else "MISSED",
              args.rate, "met" if real["fixed"]["p99"] <= 10 else "MISSED",
              "met" if real["max"]["rps"] >= 0.7 * null["max"]["rps"] else "MISSED",
              "met" if least >= 0.35 else "MISSED"))


def profile_app(n: int = 2000, small: bool = False) -> None:
    """Where one worker's CPU goes per review: the stages of the request path timed in-process."""
    import cProfile
    import pstats
    import timeit

    from webhook.admission import mutation, patchcheck
    from webhook.server import metrics, routes, worker

    body = encoded_requests(1, small)[0].partition(b"\r\n\r\n")[2]
    policies = loading.load_dir(REPO / "policies")
    review = reviews.decode(body)
    result = mutation.mutate(review.object, namespace=review.namespace or "ml-vision", policies=policies)
    patch_json = orjson.dumps(list(result.patch))
    answer = reviews.Answer(allowed=True, patch=result.patch, patch_json=patch_json)

    def per_call(fn) -> float:
        fn()
        return timeit.timeit(fn, number=n) / n * 1e6

    stages = {
        "decode review (json.loads + checks)": lambda: reviews.decode(body),
        # A fresh pod per call, as in the server (a reused dict is faster: warm caches).
        "decode + core mutation.mutate": lambda: mutation.mutate(reviews.decode(body).object,
                                                                  namespace="ml-vision", policies=policies),
        "patch applies check": lambda: patchcheck.check(review.object, patch_json),
        "encode response": lambda: reviews.encode(review, answer),
        "metrics (3 samples)": lambda: (metrics.ADMISSIONS.labels("mutate", "CREATE", "p", "patched").inc(),
                                        metrics.DURATION.labels("mutate", "patched", "training").observe(0.001),
                                        metrics.PATCH_OPERATIONS.labels("p").inc(5)),
    }
    print(f"in-process stages of one /mutate review ({n} calls each):")
    for name, fn in stages.items():
        print(f"  {name:<40}{per_call(fn):>8.0f} us")
    from benchmarks.null_server import NullCore

    for null in (True, False):
        app = routes.create_app(routes.ServerSettings(policy_dir=REPO / "policies", reload_interval=0),
                                core=NullCore() if null else None)
        client = app.test_client()
        took = per_call(lambda client=client: client.post("/mutate", data=body, content_type="application/json"))
        print(f"  {'whole app via Flask test client, ' + ('null' if null else 'gpugate'):<40}{took:>8.0f} us")
        # What the server runs for the API server's calls (worker's lean path): the route's function.
        lean = app.extensions[worker.LEAN_ROUTES].routes["/mutate"]
        took = per_call(lambda lean=lean: lean(body))
        print(f"  {'lean route (as served), ' + ('null' if null else 'gpugate'):<40}{took:>8.0f} us")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        mutation.mutate(reviews.decode(body).object, namespace="ml-vision", policies=policies)
    profiler.disable()
    print("\nprofile of mutation.mutate (tottime, top 15):")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
