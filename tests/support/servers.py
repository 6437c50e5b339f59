"""Real server processes for tests (the same launcher the demo and benchmark use)."""

from testing.local_sites import RedisProcess, free_port, port_open, wait_until

__all__ = ["RedisProcess", "free_port", "port_open", "wait_until"]
