"""Grader memory under hostile requests: 50 at once of each kind, against a real grading server in a process of
its own, whose resident memory is sampled from /proc throughout.

    PYTHONPATH=. .venv/bin/python bench/bench_grader_memory.py [--concurrency 50] [--only KIND ...] [--json out.json]

The grader (a `GradingServer` over a `GradingService`, the tiny test model as base model, an offline constant
stand-in for the evaluation: this measures the HTTP layer and the checks, not inference) serves a workspace that
holds one honest checkpoint and the hostile ones. For each kind, `--concurrency` clients attack at once; a probe
asks /health every 0.25 s meanwhile; then an honest submission must be graded. Per kind: the grader's peak RSS
(`VmHWM`, reset before each kind through /proc/<pid>/clear_refs) and its growth over the idle grader, the
answers by status, the slowest /health, and the honest submission's status. Exit 1 if any answer is a 5xx, a
/health probe fails, or the honest submission is not scored.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.tiny_model
from tests.tiny_model import build_tiny_model  # noqa: E402

MiB = 1 << 20


# -- the grader, in its own process -------------------------------------------------------------------------
def _constant(model_dir, weights_hash, spec, device=None):
    from a2rl_bench.records import EvalResult

    return EvalResult(task=spec.task, split=spec.split, score=50.0, n=4, n_correct=2, evaluator_id="constant",
                      weights_hash=weights_hash)  # fmt: skip


def serve(root: Path, model: Path) -> None:
    """Child mode: print {"port", "token"} and serve until stdin closes."""
    from a2rl_bench.grading import BudgetClock, GradingContext, GradingServer, GradingService
    from a2rl_bench.records import RunConfig

    ctx = GradingContext("bench-hostile", RunConfig(max_submissions=10_000), root / "workspace", root / "harness",
                         {"validation": 10.0}, base_model_dir=model)  # fmt: skip
    service = GradingService(ctx, BudgetClock(10**6), evaluate=_constant)
    with GradingServer(service, request_log=root / "harness" / "requests.jsonl") as server:
        print(json.dumps({"port": server.port, "token": server.token}), flush=True)
        sys.stdin.read()
    service.close(10)


# -- the hostile workspace ----------------------------------------------------------------------------------
def build_workspace(root: Path, model: Path) -> None:
    out = root / "workspace" / "output"
    for name in ("honest", "header-bomb", "config-bomb", "index-bomb", "inflated"):
        shutil.copytree(model, out / name)
    header = b'{"w": [' + b"[],[]," * ((16 * MiB - 64) // 6) + b"[]]}"  # ~360 MB for json.loads
    (out / "header-bomb" / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    (out / "config-bomb" / "config.json").write_text('{"a": [' + "[]," * 1_300_000 + "[]]}")  # 4 MiB, ~90 MB
    weight_map = ",".join(f'"t{i}":"model.safetensors"' for i in range(150_000))
    (out / "index-bomb" / "model.safetensors.index.json").write_text('{"weight_map": {' + weight_map + "}}")
    config = json.loads((out / "inflated" / "config.json").read_text())
    (out / "inflated" / "config.json").write_text(json.dumps({**config, "hidden_size": 2**20}))
    (out / "fifo").mkdir()
    for name in ("config.json", "model.safetensors"):
        os.mkfifo(out / "fifo" / name)


def add_scripts(root: Path, n: int) -> None:
    code = root / "workspace" / "code"
    for i in range(n):
        d = code / f"pkg{i // 1000}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"m{i}.py").write_text(f"import os\nX{i} = os.getcwd()\n")


# -- attacks: each returns one status (or the exception's name) -----------------------------------------------
class Target:
    def __init__(self, port: int, token: str):
        self.port, self.token = port, token
        self.url = f"http://127.0.0.1:{port}"
        self.auth = {"Authorization": f"Bearer {token}"}

    def post(self, route: str, body, timeout: float = 120) -> int | str:
        """A dict is sent as JSON; bytes or a generator of bytes as they are (a generator: chunked)."""
        try:
            if isinstance(body, dict):
                return httpx.post(self.url + route, json=body, headers=self.auth, timeout=timeout).status_code
            headers = {**self.auth, "content-type": "application/json"}
            return httpx.post(self.url + route, content=body, headers=headers, timeout=timeout).status_code
        except httpx.HTTPError as e:
            return type(e).__name__

    def honest(self) -> str:
        """An honest submission, waited for: its status ("scored"), or what went wrong."""
        try:
            r = httpx.post(self.url + "/submit", json={"model_path": "output/honest", "wait": True}, headers=self.auth,
                           timeout=300)  # fmt: skip
            return r.json()["status"] if r.status_code == 200 else f"HTTP {r.status_code}"
        except (httpx.HTTPError, ValueError, KeyError) as e:
            return type(e).__name__

    def raw(self, first: bytes, trickle: bytes, seconds: float) -> int | str:
        """Send `first`, then `trickle` every 0.5 s for up to `seconds`; the status the server answers, if any."""
        s = socket.create_connection(("127.0.0.1", self.port))
        s.settimeout(0.5)
        try:
            s.sendall(first)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    data = s.recv(4096)
                    if not data:
                        return "closed"
                    m = re.match(rb"HTTP/1\.1 (\d+)", data)
                    return int(m.group(1)) if m else "garbage"
                except TimeoutError:
                    pass
                try:
                    s.sendall(trickle)
                except OSError:
                    return "closed"
            return "still open"
        finally:
            s.close()


def _chunks(n_mib: int):
    for _ in range(n_mib):
        yield b"x" * MiB


def attacks(t: Target) -> dict:
    head = f"POST /submit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t.token}\r\n".encode()
    body_head = head + b"Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n"
    return {
        "validate: 16 MiB header of empty lists": lambda: t.post("/validate", {"model_path": "output/header-bomb"}),
        "submit: 16 MiB header of empty lists": lambda: t.post("/submit", {"model_path": "output/header-bomb"}),
        "validate: 4 MiB config.json of empty lists": lambda: t.post("/validate", {"model_path": "output/config-bomb"}),
        "validate: 4 MiB shard index (150k names)": lambda: t.post("/validate", {"model_path": "output/index-bomb"}),
        "validate: inflated config (hidden 2^20)": lambda: t.post("/validate", {"model_path": "output/inflated"}),
        "submit: FIFO checkpoint files": lambda: t.post("/submit", {"model_path": "output/fifo"}),
        "submit: 20 MiB chunked body": lambda: t.post("/submit", _chunks(20)),
        "submit: lone surrogate in model_path": lambda: t.post("/submit", b'{"model_path": "\\ud800"}'),
        "validate: 60,000-deep JSON body": lambda: t.post("/validate", b"[" * 30_000 + b"]" * 30_000),
        "request head trickled (35 s)": lambda: t.raw(head, b"X-Slow: 1\r\n", 35),
        "request body trickled (45 s)": lambda: t.raw(body_head, b"[", 45),
        "idle connection (15 s)": lambda: t.raw(b"", b"", 15),
        "final: pick changed 20 times": lambda: [t.post("/final", {"submission_id": 1 + i % 2}) for i in range(20)][-1],
        "submit: 20,000 scripts in code/": lambda: t.post("/submit", {"model_path": "output/honest"}),
    }


# -- measuring ----------------------------------------------------------------------------------------------
def status_kb(pid: int, field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))


def probe(t: Target, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        start = time.monotonic()
        try:
            code = httpx.get(t.url + "/health", timeout=10).status_code
        except httpx.HTTPError as e:
            code = type(e).__name__
        out.append((code, time.monotonic() - start))
        stop.wait(0.25)


def run_kind(t: Target, pid: int, name: str, attack, concurrency: int) -> dict:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = status_kb(pid, "VmRSS")
    stop, probes = threading.Event(), []
    prober = threading.Thread(target=probe, args=(t, stop, probes), daemon=True)
    prober.start()
    start = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(lambda _: attack(), range(concurrency)))
    seconds = time.monotonic() - start
    stop.set()
    prober.join()
    peak = status_kb(pid, "VmHWM")
    honest = t.honest()
    return {"kind": name, "seconds": round(seconds, 1), "rss_before_mb": round(before / 1024, 1),
            "peak_rss_mb": round(peak / 1024, 1), "growth_mb": round((peak - before) / 1024, 1),
            "answers": dict(collections.Counter(str(a) for a in answers)),
            "health_ok": sum(c == 200 for c, _ in probes), "health_failed": sum(c != 200 for c, _ in probes),
            "health_max_s": round(max((s for _, s in probes), default=0.0), 2),
            "honest_after": honest}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--only", nargs="*", default=None, help="substrings of the kinds to run")
    parser.add_argument("--json", default=None)
    parser.add_argument("--serve", nargs=2, metavar=("ROOT", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(Path(args.serve[0]), Path(args.serve[1]))
    root = Path(tempfile.mkdtemp(prefix="a2rl-bench-hostile-"))
    model = build_tiny_model(root / "tiny")
    build_workspace(root, model)
    (root / "harness").mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(root), str(model)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        info = json.loads(child.stdout.readline())
        t = Target(info["port"], info["token"])
        assert t.honest() == "scored"  # warm: one graded submission
        idle = status_kb(child.pid, "VmRSS") / 1024
        rows = []
        for name, attack in attacks(t).items():
            if args.only and not any(o in name for o in args.only):
                continue
            if "scripts" in name:
                add_scripts(root, 20_000)
            rows.append(run_kind(t, child.pid, name, attack, args.concurrency))
            r = rows[-1]
            print(f"{name:45s} {r['seconds']:6.1f} s  peak {r['peak_rss_mb']:6.1f} MB (+{r['growth_mb']:5.1f})  "
                  f"health {r['health_ok']} ok / {r['health_failed']} failed, max {r['health_max_s']:.2f} s  "
                  f"honest {r['honest_after']}  answers {r['answers']}", flush=True)
    finally:
        child.stdin.close()
        child.wait(30)
        shutil.rmtree(root, ignore_errors=True)
    worst = max(rows, key=lambda r: r["peak_rss_mb"])
    print(f"\nidle grader {idle:.1f} MB; highest peak {worst['peak_rss_mb']:.1f} MB ({worst['kind']}); "
          f"{args.concurrency} at once per kind; {os.cpu_count()} CPUs")
    bad = [r["kind"] for r in rows if r["health_failed"] or r["honest_after"] != "scored"
           or any(a.startswith("5") for a in r["answers"])]  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"idle_mb": round(idle, 1), "concurrency": args.concurrency,
                                               "rows": rows, "bad": bad}, indent=1))  # fmt: skip
    if bad:
        print(f"FAILED: {bad}")
        sys.exit(1)


if __name__ == "__main__":
    main()
