"""Children of ``dayzero serve`` end when it ends, even when it is SIGKILLed.

The launcher puts its pid into ``DAYZERO_PARENT_PID`` of every child (``launch.ManagedProcess``).
Each service calls :func:`exit_with_parent` first thing in ``main``: a daemon thread polls
``getppid()`` and, once the parent is gone (the child was re-parented), sends the process its own
SIGTERM, so the service's usual graceful stop runs; SIGKILL follows if that has not ended it within
the grace period. Programs that cannot watch for themselves (redis-server) run under
``python -m dayzero.serving.parent_watch -- PROGRAM ARGS...``, which does the same for them.
Without the variable (Kubernetes, tests that start a service directly) nothing is watched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

PARENT_ENV = "DAYZERO_PARENT_PID"


def _watch(parent: int, on_gone, interval: float) -> None:
    while os.getppid() == parent:
        time.sleep(interval)
    on_gone()


def exit_with_parent(interval: float = 0.5, grace: float = 20.0) -> threading.Thread | None:
    """Start the watch if the launcher asked for it; returns the thread (None when not asked)."""
    value = os.environ.pop(PARENT_ENV, None)  # grandchildren have another parent
    if not value:
        return None
    parent = int(value)

    def gone() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)
        os.kill(os.getpid(), signal.SIGKILL)

    t = threading.Thread(target=_watch, args=(parent, gone, interval), name="parent-watch", daemon=True)
    t.start()
    return t


def run_guarded(argv: list[str], interval: float = 0.5, grace: float = 10.0) -> int:
    """Run ``argv`` as a child; end it when our parent goes away; return its exit code.

    A SIGTERM/SIGINT to this process is passed on to the child, and we exit when it does.
    """
    value = os.environ.pop(PARENT_ENV, None)
    child = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.poll() is None and child.send_signal(s))
    parent = int(value) if value else None
    while True:
        try:
            return child.wait(interval)
        except subprocess.TimeoutExpired:
            pass
        if parent is not None and os.getppid() != parent:
            child.terminate()
            try:
                return child.wait(grace)
            except subprocess.TimeoutExpired:
                child.kill()
                return child.wait()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m dayzero.serving.parent_watch -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    return run_guarded(args)


if __name__ == "__main__":
    sys.exit(main())
