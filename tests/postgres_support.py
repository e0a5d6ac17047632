"""A throwaway PostgreSQL cluster for tests and benchmarks: initdb into a temporary directory, `pg_ctl start` on
a free loopback port, trust authentication, gone again at `stop()`.

The system's PostgreSQL binaries (Debian's `postgresql-15`, installed by `make test`) are found on PATH or under
/usr/lib/postgresql. PostgreSQL refuses to run as root, so under root the cluster belongs to the `postgres` system
user the package creates. Standard library only: a benchmark's own virtual environment can use it too.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries on this machine (`make test` installs them: apt-get install postgresql-15)."""


def postgres_bin_dir() -> Path:
    """The directory of `initdb` and `pg_ctl` (the newest major version when several are installed)."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if not versions:
        raise PostgresUnavailable("PostgreSQL is not installed: `make test` installs it "
                                  "(apt-get install postgresql-15), or put pg_ctl on PATH")  # fmt: skip
    return Path(versions[-1]).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    """One cluster on 127.0.0.1:<free port>; databases made with `create_database`, reached with `url()`."""

    USER = "postgres"  # the cluster's superuser (trust authentication on loopback only)

    def __init__(self) -> None:
        self.bin = postgres_bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="a2rl-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if self._owner is not None:  # root: the cluster's files belong to the postgres user
            os.chown(self.root, self._owner.pw_uid, self._owner.pw_gid)

    def start(self, timeout_s: float = 120) -> LocalPostgres:
        """initdb (fsync off: a throwaway cluster) and start; returns once it accepts connections."""
        self._run("initdb", "-D", str(self.data), "-U", self.USER, "--auth=trust", "-E", "UTF8", "--no-sync",
                  timeout_s=timeout_s)  # fmt: skip
        return self.resume(timeout_s)

    def resume(self, timeout_s: float = 120) -> LocalPostgres:
        """Start the server on its files and port (after `halt()`: the database comes back); returns once it accepts
        connections."""
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories='{self.root}' "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200")  # fmt: skip
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w",
                  "-t", str(int(timeout_s)), "start", timeout_s=timeout_s + 10)  # fmt: skip
        return self

    def create_database(self, name: str) -> str:
        """A new database `name`; returns its SQLAlchemy asyncpg URL (what Prefect's server takes)."""
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.USER, name, timeout_s=60)
        return self.url(name)

    def dump(self, database: str) -> str:
        """The database's schema and rows as SQL (`pg_dump`, plain format, no owners or grants): what `load` takes."""
        return self._run("pg_dump", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.USER, "--no-owner",
                         "--no-privileges", database, timeout_s=120)  # fmt: skip

    def load(self, database: str, sql: str) -> None:
        """Run `sql` (a `dump`) into `database` with psql, stopping at the first error."""
        self._run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.USER, "-d", database, "-q",
                  "-v", "ON_ERROR_STOP=1", "-f", "-", timeout_s=120, stdin=sql)  # fmt: skip

    def url(self, database: str, driver: str = "postgresql+asyncpg") -> str:
        return f"{driver}://{self.USER}@127.0.0.1:{self.port}/{database}"

    def libpq(self, database: str) -> str:
        """A libpq connection string (DuckDB's postgres extension, psql)."""
        return f"host=127.0.0.1 port={self.port} user={self.USER} dbname={database}"

    def psql(self, database: str, sql: str) -> str:
        """Run one SQL statement with psql; its rows, unaligned, one per line."""
        return self._run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.USER, "-d", database, "-tA",
                         "-v", "ON_ERROR_STOP=1", "-c", sql, timeout_s=60).strip()  # fmt: skip

    def halt(self) -> None:
        """Stop the server (fast shutdown), keeping its files: the database is down, `stop()` still cleans up."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop", timeout_s=90)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete the cluster's files."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop", timeout_s=90)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, program: str, *args: str, timeout_s: float, stdin: str | None = None) -> str:
        cmd = [str(self.bin / program), *args]
        owner = self._owner
        # Text over pipes, not files: under root the programs run as `postgres`, which cannot read the caller's folders.
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, cwd=self.root, start_new_session=True, input=stdin,
            user=owner.pw_uid if owner else None, group=owner.pw_gid if owner else None,
            extra_groups=[] if owner else None, env={**os.environ, "PGTZ": "UTC", "LC_ALL": "C"},
        )  # fmt: skip
        if out.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{program} failed (exit {out.returncode}): {out.stderr.strip() or out.stdout.strip()}"
                               f"\n{tail}")  # fmt: skip
        return out.stdout
