"""The rendezvous store, hosted by the launcher (as torchrun's agent hosts it), never by a rank.

`launcher_store(host, port)` creates the c10d TCPStore server in the launching process, before any rank starts;
`agent_env(host, store.port)` is what the ranks need to join it: MASTER_ADDR/MASTER_PORT and
TORCHELASTIC_USE_AGENT_STORE=True, with which torch's env:// rendezvous (torch.distributed.rendezvous.
_create_c10d_store) makes every rank, rank 0 included, a client of that server instead of rank 0 binding one.

Why: the previous scheme picked a "free" port (bind port 0, read it, close the socket) and let rank 0 bind it
later; between the two another job on the machine could take the port (EADDRINUSE at rendezvous, seen with
two test suites at once). Here port 0 is bound once, by the store's own listening socket, and its number
(`store.port`) is handed on: there is no window in which the port is free. Env:// plus the agent flag (rather
than passing a Store object) is chosen because it is what the ranks see under torchrun too, so the worker and
`train()` keep initializing themselves from the environment, unchanged.

The listening socket is bound by us and handed to the store (`master_listen_fd`), so a loopback host listens
on 127.0.0.1 only (torch's server would otherwise listen on every interface); any other host (node 0 of a
multi-node run, `--master-addr`) listens on all interfaces at the given port. The store lives as long as the
returned object: keep it until the ranks have ended. Key LAUNCHER_KEY holds the launcher's pid (a test checks
that the ranks joined the launcher's store and not one of their own).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch.distributed as dist

from paracube.errors import ParacubeError

LAUNCHER_KEY = "paracube/launcher_pid"
STORE_TIMEOUT = timedelta(seconds=600)  # the clients' wait for peers (torch's default rendezvous timeout)


def _is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost") or host.startswith("127.")


def launcher_store(host: str = "127.0.0.1", port: int = 0) -> dist.TCPStore:
    """A TCPStore server on `host:port` (port 0: one the kernel picks, read back as `.port`); loopback hosts
    listen on 127.0.0.1 only. ParacubeError naming the port when it cannot be bound."""
    bind = "127.0.0.1" if _is_loopback(host) else ""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        where = f"{bind or '0.0.0.0'}:{port}"
        raise ParacubeError(f"cannot listen on {where} for the rendezvous ({exc.strerror}); choose another "
                            "--master-port") from None
    bound = int(sock.getsockname()[1])
    store = dist.TCPStore("127.0.0.1" if bind else host, bound, None, True, STORE_TIMEOUT, wait_for_workers=False,
                          master_listen_fd=sock.detach())  # the store owns the socket now
    store.set(LAUNCHER_KEY, str(os.getpid()))
    return store


def agent_env(host: str, port: int) -> dict[str, str]:
    """The environment with which a rank's env:// rendezvous joins the launcher's store as a client."""
    return {"MASTER_ADDR": host, "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"}


__all__ = ["LAUNCHER_KEY", "agent_env", "launcher_store"]
