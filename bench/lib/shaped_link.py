"""Two network namespaces joined by one veth pair (eth0 on both), with addresses, an
MTU and an optional tc rate, removed on exit: the link the protocol benches share."""

import os
import subprocess

TARGET_IP, INITIATOR_IP = "10.78.0.1", "10.78.0.2"
CPUS = os.cpu_count() or 1
# Target and initiator each get a CPU of their own, as on two hosts.
PIN_TARGET = ["taskset", "-c", "0"] if CPUS >= 2 else []
PIN_INITIATOR = ["taskset", "-c", f"1-{CPUS - 1}"] if CPUS >= 2 else []


def sh(*args, check=True, **kwargs):
    return subprocess.run(list(args), check=check, **kwargs)


def in_ns(ns, *args):
    return ["ip", "netns", "exec", ns, *args]


class ShapedLink:
    """`with ShapedLink(prefix, mtu, rate_mbit) as link:` — link.target and
    link.initiator are the namespaces' names (unique per process)."""

    def __init__(self, prefix, mtu, rate_mbit=0):
        self.target = f"{prefix}-t{os.getpid()}"
        self.initiator = f"{prefix}-i{os.getpid()}"
        self.mtu, self.rate_mbit = mtu, rate_mbit

    def __enter__(self):
        try:
            for ns in (self.target, self.initiator):
                sh("ip", "netns", "add", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", self.target, "link", "add", "eth0", "type", "veth",
               "peer", "name", "eth0", "netns", self.initiator)
            for ns, ip in ((self.target, TARGET_IP), (self.initiator, INITIATOR_IP)):
                sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            self.set(self.mtu, self.rate_mbit)
        except BaseException:
            self.remove()
            raise
        return self

    def set(self, mtu, rate_mbit=0):
        """Changes the MTU and the rate (0: unlimited) of both ends."""
        self.mtu, self.rate_mbit = mtu, rate_mbit
        for ns in (self.target, self.initiator):
            sh("ip", "-n", ns, "link", "set", "eth0", "mtu", str(mtu), "up")
            sh("tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root",
               check=False, stderr=subprocess.DEVNULL)
            if rate_mbit:
                # Each side shapes what it sends: both directions at the rate.
                burst = max(mtu * 10, rate_mbit * 1000 // 8 // 100)
                sh("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "tbf",
                   "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms")

    def remove(self):
        for ns in (self.target, self.initiator):
            sh("ip", "netns", "del", ns, check=False, stderr=subprocess.DEVNULL)

    def __exit__(self, *exc):
        self.remove()
