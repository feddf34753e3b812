"""The task ``qrsh -inherit`` starts on each host of an ``apportion sge`` job.

``python -m apportion.deploy.sge_task [--own-address] -- WORKER...`` runs WORKER
(the host's worker supervisor) and drains it when its own standard input ends.

qrsh passes no signal on as itself: sent SIGTERM, the qrsh client ends its remote
task at once (on Son of Grid Engine 8.1.9 a trap in the task never runs), so the
workers could not drain. It does pass on standard input, to its end: when
``apportion sge`` closes its end of the pipe, the read here returns, and the
supervisor gets SIGTERM and drains its workers. We exit with its status, which
qrsh returns. SIGTERM or SIGINT sent here directly are passed on the same way.

SIGUSR2, ``-notify``'s warning before ``qdel``'s SIGKILL, reaches every task of the
job: it is ignored here and by the supervisor (inherited), since ``apportion sge``
alone answers it, by closing the pipe.

``--own-address``: on several hosts, each worker serves data on its host's address
(as its name resolves), which the other hosts can reach, not on loopback.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from apportion.deploy.sge_plan import OWN_ADDRESS


def _drain_on_eof(child: subprocess.Popen[bytes]) -> None:
    """Wait for the end of standard input, then SIGTERM ``child`` (if it still runs)."""
    try:
        while os.read(0, 65536):
            pass
    except OSError:  # no standard input at all: nothing to wait for
        return
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    own_address = args[:1] == [OWN_ADDRESS]
    if own_address:
        args = args[1:]
    if args[:1] != ["--"] or len(args) < 2:
        print(f"usage: {__name__} [{OWN_ADDRESS}] -- WORKER...", file=sys.stderr)
        return 2
    command = args[1:]
    if own_address:
        try:
            command += ["--host", socket.gethostbyname(socket.gethostname())]
        except OSError as exc:
            print(f"cannot resolve this host's name {socket.gethostname()}: {exc}", file=sys.stderr)
            return 1
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)

    def forward(signum: int, frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    threading.Thread(target=_drain_on_eof, args=(child,), daemon=True).start()
    status = child.wait()
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main())
