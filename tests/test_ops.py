"""Process management of a2rl_bench.ops.prefect_local without a Prefect server: state files, stopping, leftovers."""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from a2rl_bench.ops import prefect_local

# Like `prefect worker start`: the first SIGTERM only asks it to stop (and it stays up), the second ends it.
STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    log = open(sys.argv[1], "a", buffering=1)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])                       # a flow run
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)  # its agent
    terms = []
    def on_term(sig, frame):
        terms.append(sig)
        log.write("TERM\\n")
        if len(terms) == 2:
            sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    log.write("ready\\n")
    while True:
        time.sleep(0.1)
""")


def _start_managed(tmp_path: Path, state: str) -> tuple[prefect_local.ManagedProcess, Path]:
    log = tmp_path / "signals.log"
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    proc = prefect_local._spawn([sys.executable, str(script), str(log)], env={"PATH": "/usr/bin:/bin"}, log=tmp_path / "out.log")
    deadline = time.monotonic() + 30
    while "ready" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, (tmp_path / "out.log").read_text()
        time.sleep(0.05)
    managed = prefect_local.ManagedProcess(name="worker", pid=proc.pid, create_time=psutil.Process(proc.pid).create_time(),
                                           log=str(log))
    prefect_local._write_state(managed, state, tmp_path)
    return managed, log


def test_stop_worker_sends_term_twice_and_leaves_no_process_behind(tmp_path):
    worker, log = _start_managed(tmp_path, prefect_local.WORKER_STATE)
    family = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
    assert len(family) == 3

    assert prefect_local.stop_worker(tmp_path, timeout_s=20) is True

    assert log.read_text().count("TERM") == 2
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not (tmp_path / prefect_local.WORKER_STATE).exists()
    assert prefect_local.stop_worker(tmp_path) is False  # nothing left to stop


def test_stop_server_does_not_wait_forever_for_a_server_that_stays_up(tmp_path):
    server, log = _start_managed(tmp_path, prefect_local.SERVER_STATE)
    family = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
    t = time.monotonic()
    assert prefect_local.stop_server(tmp_path, timeout_s=2) is True
    assert time.monotonic() - t < 20
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_reused_pid_is_not_mistaken_for_our_process(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        impostor = prefect_local.ManagedProcess(name="server", pid=proc.pid,
                                                  create_time=psutil.Process(proc.pid).create_time() - 100, log="x")
        assert not impostor.alive()
        prefect_local._write_state(impostor, prefect_local.SERVER_STATE, tmp_path)
        prefect_local.stop_server(tmp_path)
        assert proc.poll() is None  # not ours: untouched
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_state_files_round_trip_and_tolerate_garbage(tmp_path):
    p = prefect_local.ManagedProcess(name="worker", pid=1234, create_time=1.5, log="/tmp/w.log", url="http://127.0.0.1:1/api", pool="a2rl-local")
    prefect_local._write_state(p, prefect_local.WORKER_STATE, tmp_path)
    assert prefect_local.read_state(prefect_local.WORKER_STATE, tmp_path) == p
    (tmp_path / prefect_local.SERVER_STATE).write_text("{not json")
    assert prefect_local.read_state(prefect_local.SERVER_STATE, tmp_path) is None


def test_resolve_api_url_prefers_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://example.invalid/api")
    assert prefect_local.resolve_api_url(tmp_path) == "http://example.invalid/api"
    monkeypatch.delenv("PREFECT_API_URL")
    assert prefect_local.resolve_api_url(tmp_path) is None  # no env, no running server of ours


def test_start_server_refuses_a_port_where_another_server_answers(tmp_path):
    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with pytest.raises(prefect_local.OpsError, match="already answers"):
            prefect_local.start_server(port=httpd.server_address[1], home=tmp_path)
    finally:
        httpd.shutdown()
    assert not (tmp_path / prefect_local.SERVER_STATE).exists()


def test_server_status_without_a_server_says_how_to_start_one(tmp_path, monkeypatch, capsys):
    from a2rl_bench.cli import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    assert main(["server", "status"]) == 1
    assert "a2rl server start" in capsys.readouterr().out


def answer_json(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    """A loopback test server's JSON answer, as Prefect's server sends one."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def test_a_busy_server_is_asked_again_briefly_and_its_lasting_answer_stands():
    """Prefect's server answers 503 while its SQLite database is locked by other writers (a sweep, a loaded
    machine): the ops client asks again within about two seconds, so `a2rl retry` or `a2rl status` does not fail on
    a moment's contention; a server that stays busy gets its answer reported after four tries."""
    import httpx

    from a2rl_bench.ops import prefect_api

    def serve(busy_answers: int) -> tuple[http.server.HTTPServer, list[str]]:
        seen: list[str] = []

        class Busy(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # the client's CSRF token: this server, like an older one, has none
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                seen.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
                busy = len(seen) <= busy_answers
                body = b'{"exception_message": "Service Unavailable"}' if busy else b"7"
                answer_json(self, 503 if busy else 200, body)

            def log_message(self, *args):
                pass

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return httpd, seen

    httpd, seen = serve(busy_answers=2)
    try:
        with prefect_api.client(prefect_local.api_url_of("127.0.0.1", httpd.server_address[1])) as c:
            assert c.count_flow_runs() == 7
        assert len(seen) == 3 and seen[0] == seen[2]  # the same request, body and all, sent again
    finally:
        httpd.shutdown()
    httpd, seen = serve(busy_answers=100)
    try:
        with prefect_api.client(prefect_local.api_url_of("127.0.0.1", httpd.server_address[1])) as c:
            with pytest.raises(httpx.HTTPStatusError) as failed:
                c.count_flow_runs()
        assert failed.value.response.status_code == 503 and len(seen) == 1 + len(prefect_api.BUSY_WAITS_S)
    finally:
        httpd.shutdown()


def test_the_ops_client_trusts_the_ca_file_and_skip_verify_prefect_is_configured_with(tmp_path):
    """A Prefect server behind TLS with a private CA: PREFECT_API_SSL_CERT_FILE (or
    PREFECT_API_TLS_INSECURE_SKIP_VERIFY) is what Prefect's own client trusts, and the ops client (lease renewals,
    `a2rl status`, `a2rl retry`) must trust the same; without either it refuses the certificate. Its TLS context is
    made once per setting, not per call (what each call cost, BENCHMARKS.md "Suite wall time, seventeenth pass")."""
    import ssl

    import httpx
    from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY, temporary_settings

    from a2rl_bench.ops import prefect_api

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key),
                    "-out", str(cert), "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)  # fmt: skip

    class Version(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            answer_json(self, 200, b'"3.9.1"')

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Version)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{httpd.server_address[1]}/api"
    try:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            with prefect_api.client(url) as c:
                c.api_version()
        with temporary_settings(updates={PREFECT_API_SSL_CERT_FILE: str(cert)}):
            for _ in range(2):
                with prefect_api.client(url) as c:
                    assert c.api_version() == "3.9.1"
            assert len({id(prefect_api._tls_context()) for _ in range(3)}) == 1  # one context for the setting
        with temporary_settings(updates={PREFECT_API_TLS_INSECURE_SKIP_VERIFY: True}):
            with prefect_api.client(url) as c:
                assert c.api_version() == "3.9.1"
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):  # the settings' end ends it
            with prefect_api.client(url) as c:
                c.api_version()
    finally:
        httpd.shutdown()


def test_a_server_that_accepts_but_never_answers_costs_one_timeout_not_prefects_retries():
    """`a2rl status` against a stuck server says so after its timeout: the ops client (a2rl_bench.ops.prefect_api)
    does not add Prefect's five backed-off retries (2 + 4 + 8 + 16 + 32 s) on top."""
    import socket

    import prefect.client.orchestration  # noqa: F401  (imported on first use: not part of what is timed)

    with socket.socket() as silent:  # connections complete in the backlog; nothing ever reads or answers them
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = prefect_local.api_url_of("127.0.0.1", silent.getsockname()[1])
        t = time.monotonic()
        problem = prefect_local.database_problem(url, timeout_s=0.5)
        took = time.monotonic() - t
        assert problem is not None and problem.startswith("ReadTimeout"), problem
        # Counted, not timed: every try is a connection waiting in the backlog. A retry would also have waited
        # 2 s before it (the bound leaves a loaded machine room to build the client).
        silent.setblocking(False)
        tries = 0
        while True:
            try:
                silent.accept()[0].close()
            except BlockingIOError:
                break
            tries += 1
        assert tries == 1, f"{tries} connections: Prefect's retries were made"
        assert took < 2.9, f"{took:.1f} s: a retry (the first waits 2 s) was made"
        assert not prefect_local.server_healthy(url, timeout_s=0.5)


def test_reads_inside_one_open_client_share_it_and_other_threads_open_their_own():
    """`a2rl status` opens one client and its dozen reads share it (each new one costs ~50 ms); the lease's
    renewal thread never borrows the flow's."""
    from a2rl_bench.ops import prefect_api

    url = "http://127.0.0.1:9/api"  # nothing is sent: opening a client does not connect
    with prefect_api.client(url) as outer:
        with prefect_api.client(url) as inner:
            assert inner is outer
        with prefect_api.client(url, timeout_s=1.0) as other:
            assert other is not outer
        seen = []

        def in_a_thread() -> None:
            with prefect_api.client(url) as c:
                seen.append(c)

        thread = threading.Thread(target=in_a_thread)
        thread.start()
        thread.join()
        assert seen and seen[0] is not outer
    with prefect_api.client(url) as later:
        assert later is not outer  # the outer one is closed


def test_a2rl_status_asks_a_server_that_answered_too_late_again_and_a_gone_one_not(capsys):
    """#44: a sweep keeps the server busy and a read times out: `a2rl status` asks again (twice, after a wait)
    instead of printing "cannot list flow runs: ReadTimeout"; a refused connection is answered at once."""
    import httpx

    from a2rl_bench.cli import with_read_retries

    release, hits = threading.Event(), []

    class Busy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            if len(hits) <= 2:
                release.wait(60)  # the first two are answered after the client gave up on them
            try:
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
            except (BrokenPipeError, ConnectionResetError):  # a late answer that nobody reads any more
                pass

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/flow_runs"
    timeouts = iter([0.5, 0.5, 60.0])
    try:
        assert with_read_retries(lambda: httpx.get(url, timeout=next(timeouts)).text, waits_s=(0.1, 0.1)) == "ok"
        assert len(hits) == 3
        assert capsys.readouterr().err.count("the server answered too late (ReadTimeout); asking again") == 2
        server.shutdown()
        server.server_close()
        gone = []
        with pytest.raises(httpx.ConnectError):
            with_read_retries(lambda: gone.append(1) or httpx.get(url, timeout=5).text, waits_s=(0.1, 0.1))
        assert gone == [1]  # not asked again
    finally:
        release.set()
        server.server_close()


def test_a_database_outage_is_told_apart_from_a_bad_request_by_the_errors_cause():
    """The server's 503 'wait it out' answer (a2rl_bench.ops.crash_reports) is for a database that cannot be reached,
    however deep in the cause chain asyncpg's error sits; any other error keeps Prefect's own answer."""
    import asyncpg.exceptions as pg

    from a2rl_bench.ops.crash_reports import database_unreachable

    wrapped = RuntimeError("while creating a task run")
    wrapped.__cause__ = pg.CannotConnectNowError("the database system is starting up")
    assert database_unreachable(pg.ConnectionDoesNotExistError("connection was closed in the middle of operation"))
    assert database_unreachable(pg.AdminShutdownError("terminating connection due to administrator command"))
    assert database_unreachable(wrapped)
    assert database_unreachable(ConnectionRefusedError(111, "Connect call failed"))
    assert not database_unreachable(ValueError("bad parameter"))
    assert not database_unreachable(pg.UniqueViolationError("duplicate key"))
