"""Free ports on this machine, for a PS's private port (the proxy backend) and for local
test clusters.

Standard library only, so that both the PS side (``tictac_hooks.enforce``) and the test
bed (``tictac_hooks.cluster``) can use it.
"""

from __future__ import annotations

import random
import socket


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the caller binds it soon after).

    Picked below the kernel's ephemeral range where possible: the many short-lived
    outgoing connections of a test run take their source ports from that range, and
    one of them could take a port between this check and the server's bind.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low, _ = _ephemeral_range()
    if low > 12000:
        for _ in range(50):
            port = random.randrange(10000, low - 1)
            with socket.socket(family) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
