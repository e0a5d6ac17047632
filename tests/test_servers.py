"""`a2rl server` as a newcomer meets it (issue #45): a bind beyond loopback is said to be unauthenticated and its
UI is served an address a browser can reach; `stop --port N` stops only the server on port N and says which it
stopped; `status --port N` from another PREFECT_HOME reports the server that answers there, not "not running"."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
from urllib.parse import urlsplit

import psutil
import pytest

from live_server import free_port


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_a_bind_beyond_loopback_warns_that_the_server_is_unauthenticated(host):
    from a2rl_bench.ops import prefect_local

    warning = prefect_local.exposure_warning(host, 4300)
    assert warning is not None and "no authentication" in warning and "4300" in warning and "127.0.0.1" in warning
    assert ("every interface" in warning) == (host in ("0.0.0.0", "::"))
    for local in ("127.0.0.1", "localhost", "::1"):
        assert prefect_local.exposure_warning(local, 4300) is None


def test_a_wildcard_servers_ui_is_given_an_address_not_the_host_name():
    """The UI of `--host 0.0.0.0` called the machine's host name, which the browser's machine may not resolve."""
    from a2rl_bench.ops import prefect_local

    ui = urlsplit(prefect_local.ui_env("0.0.0.0", 4300)["PREFECT_UI_API_URL"])
    ipaddress.ip_address(ui.hostname)  # an address, not socket.gethostname()
    assert ui.port == 4300 and ui.hostname != "0.0.0.0"
    assert prefect_local.ui_env("127.0.0.1", 4300)["PREFECT_UI_API_URL"] == "http://127.0.0.1:4300/api"


def test_stop_and_status_with_a_port_mean_the_server_on_that_port(prefect_harness, tmp_path, monkeypatch, capsys):
    """`a2rl server stop --port 1` stopped the server on another port without saying which; from another
    PREFECT_HOME, `status` said "not running" while the named port answered (here: the test server's)."""
    from prefect.settings import PREFECT_API_URL

    from a2rl_bench.cli import main
    from a2rl_bench.ops import prefect_local

    answering = prefect_local.url_port(PREFECT_API_URL.value())
    home = tmp_path / "home"
    home.mkdir()
    # This home's server, as `a2rl server start` records it: a process of its own session on another port.
    ours_port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        ours = prefect_local.ManagedProcess(name="server", pid=proc.pid, log=str(home / "a2rl-server.log"),
                                            create_time=psutil.Process(proc.pid).create_time(),
                                            url=prefect_local.api_url_of("127.0.0.1", ours_port))  # fmt: skip
        prefect_local._write_state(ours, prefect_local.SERVER_STATE, home)
        monkeypatch.setenv("PREFECT_HOME", str(home))
        monkeypatch.delenv("PREFECT_API_URL", raising=False)

        assert main(["server", "stop", "--port", str(answering)]) == 1
        out = capsys.readouterr().out
        assert ours.alive(), out  # not this home's server: left running
        assert f"no server on port {answering}" in out and f"{ours_port}" in out and "left running" in out, out
        assert f"127.0.0.1:{answering}/api) answers there" in out, out

        assert main(["server", "status", "--port", str(answering)]) == 0
        out = capsys.readouterr().out
        assert f"server http://127.0.0.1:{answering}/api: up" in out, out

        assert main(["server", "stop"]) == 0
        out = capsys.readouterr().out
        assert not ours.alive() and f"server ({ours.url}, pid {proc.pid}) stopped" in out, out
    finally:
        if proc.poll() is None:
            proc.kill()


def test_server_start_names_the_processes_that_hold_its_database(tmp_path):
    """`a2rl server start` beside a running `a2rl run` sharing one prefect.db gave six "database is locked"
    tracebacks; the processes holding the database are named before the server starts."""
    from a2rl_bench.ops import prefect_local

    db = tmp_path / "prefect.db"
    holder = subprocess.Popen([sys.executable, "-c", f"import sqlite3, time; c = sqlite3.connect({str(db)!r}); "
                               "c.execute('create table t (x)'); c.commit(); print('open', flush=True); "
                               "time.sleep(600)"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "open"
        said = prefect_local.database_users(tmp_path)
        assert said is not None and f"pid {holder.pid}" in said and "database is locked" in said, said
    finally:
        holder.kill()
    holder.wait()
    assert prefect_local.database_users(tmp_path) is None


def test_a_plain_run_holds_no_gpu_slot_and_prefect_does_not_warn_of_a_missing_limit(prefect_harness, caplog):
    """Every plain run logged Prefect's WARNING "Concurrency limits ['gpu'] do not exist" (the limit is a sweep's)."""
    import logging
    import uuid

    from a2rl_bench.ops import gpu_slots

    said: list[str] = []
    with caplog.at_level(logging.WARNING):
        with gpu_slots.hold_gpu_slot(str(uuid.uuid4()), said.append, name=f"gpu-none-{uuid.uuid4().hex[:8]}"):
            held = True
    assert held and not said
    assert not [r for r in caplog.records if "do not exist" in r.getMessage()], caplog.text


def test_server_start_beside_a_process_on_its_database_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """It was only a warning, and the server then started on the shared prefect.db: refused now, nothing started,
    one line that says how to start one anyway."""
    import a2rl_bench.cli
    from a2rl_bench.ops import prefect_local

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    monkeypatch.delenv(prefect_local.DATABASE_ENV, raising=False)
    db, port = tmp_path / "prefect.db", free_port()
    holder = subprocess.Popen([sys.executable, "-c", f"import sqlite3, time; c = sqlite3.connect({str(db)!r}); "
                               "c.execute('create table t (x)'); c.commit(); print('open', flush=True); "
                               "time.sleep(600)"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "open"
        assert a2rl_bench.cli.main(["server", "start", "--no-worker", "--port", str(port)]) == 1
    finally:
        holder.kill()
    holder.wait()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "server not started" in err and f"pid {holder.pid}" in err, err
    assert "PREFECT_HOME=DIR a2rl server start" in err
    assert prefect_local.read_state(prefect_local.SERVER_STATE, tmp_path) is None
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens on the port it was asked for
