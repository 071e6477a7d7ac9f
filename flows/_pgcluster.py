"""A throwaway PostgreSQL cluster, for the tests and ``respflow bench --store``: ``initdb`` into
a temporary directory, ``pg_ctl start`` on a free loopback port, ``pg_ctl stop`` and the
directory removed at the end.

PostgreSQL refuses to run as root, so as root the server commands run as the ``postgres`` user
(``runuser``), which then owns the directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator


class ClusterUnavailable(RuntimeError):
    """PostgreSQL's server binaries are not installed here."""


def binary(name: str) -> str | None:
    """The path of a PostgreSQL server binary: on PATH, else the newest under /usr/lib/postgresql."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def cluster(*, durable: bool = False) -> Iterator[str]:
    """A running cluster; yields the DSN of its ``postgres`` database.

    ``durable``: PostgreSQL's default commit settings (fsync, synchronous commit), as a real
    deployment runs; else both off (tests: faster, nothing to keep).

    Raises:
        ClusterUnavailable: no ``initdb``/``pg_ctl`` on this machine.
        RuntimeError: the server did not start (with its log's tail).
    """
    initdb, pg_ctl = binary("initdb"), binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise ClusterUnavailable("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")
    root = tempfile.mkdtemp(prefix="respflow-pg-")
    data = os.path.join(root, "data")
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
        os.chmod(root, 0o700)
    port = _free_port()
    log = os.path.join(root, "server.log")
    settings = "" if durable else " -c fsync=off -c synchronous_commit=off"
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200{settings}"
    try:
        subprocess.run(
            [*as_user, initdb, "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            [*as_user, pg_ctl, "-D", data, "-o", options, "-l", log, "-w", "-t", "60", "start"],
            check=True,
            capture_output=True,
            timeout=90,
        )
    except subprocess.CalledProcessError as exc:
        tail = pathlib.Path(log).read_text()[-2000:] if os.path.exists(log) else ""
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"PostgreSQL did not start: {exc.stderr.decode()[-1000:]} {tail}") from None
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"], capture_output=True, timeout=60, check=False)
        shutil.rmtree(root, ignore_errors=True)
