"""A service whose gRPC port is taken exits with code 2 and says which port (a real router process)."""

from __future__ import annotations

import socket
import subprocess
import sys


def test_router_on_a_taken_port_exits_2_naming_the_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "dayzero_router", "--host", "127.0.0.1", "--port", str(port),
                               "--redis-url", "memory://", "--http-port", "0"],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot bind gRPC port 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
