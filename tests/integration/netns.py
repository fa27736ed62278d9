"""Network namespaces a chaos test makes for itself: a veth pair from the host's namespace into a
namespace of its own, and iptables DROP rules inside that namespace to cut the link both ways (this
kernel has no netem). Root only; a test skips with the reason elsewhere, except under CI=true, where
.ci/run installs iproute2 and iptables and runs as root. Nothing outside the namespace and its veth
pair is touched, and both are deleted at the end."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from conftest import require_binary


def require_netns() -> None:
    """Skip (fail under CI=true) unless this process may make namespaces: root, ip and iptables."""
    require_binary("ip", "iproute2")
    require_binary("iptables", "iptables")
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the chaos tests need root under CI=true (.ci/run runs as root)")
        pytest.skip("the chaos tests make network namespaces and iptables rules: root only")


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=10)


@dataclass
class Netns:
    """One namespace joined to the host's by a veth pair: `host_ip` on the host side, `ns_ip` inside."""

    name: str
    host_ip: str
    ns_ip: str
    cut_now: bool = False

    def prefix(self) -> list[str]:
        """What runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        """Drop every packet in and out of the namespace (both directions of the link)."""
        for chain in ("INPUT", "OUTPUT"):
            _run("ip", "netns", "exec", self.name, "iptables", "-w", "5", "-I", chain, "-j", "DROP")
        self.cut_now = True

    def cut_port(self, host: str, port: int) -> None:
        """Drop only the namespace's traffic with one host:port, both ways (its other links stay up)."""
        for chain, match in (("OUTPUT", ["-d", host, "--dport"]), ("INPUT", ["-s", host, "--sport"])):
            _run(*self.prefix(), "iptables", "-w", "5", "-I", chain, "-p", "tcp", *match, str(port), "-j", "DROP")
        self.cut_now = True

    def heal(self) -> None:
        for chain in ("INPUT", "OUTPUT"):
            _run("ip", "netns", "exec", self.name, "iptables", "-w", "5", "-F", chain)
        self.cut_now = False


@contextmanager
def netns() -> Iterator[Netns]:
    """A namespace of this test's own (random name and /30 subnet), removed afterwards."""
    require_netns()
    tag = secrets.token_hex(3)
    name, host_if, ns_if = f"zfabchaos-{tag}", f"zc{tag}h", f"zc{tag}n"
    a, b = secrets.randbelow(200) + 20, secrets.randbelow(60) * 4
    host_ip, ns_ip = f"10.{a}.{b // 256}.{b % 256 + 1}", f"10.{a}.{b // 256}.{b % 256 + 2}"
    _run("ip", "netns", "add", name)
    try:
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _run("ip", "link", "set", ns_if, "netns", name)
        _run("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        _run("ip", "netns", "exec", name, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _run("ip", "netns", "exec", name, "ip", "link", "set", ns_if, "up")
        _run("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield Netns(name, host_ip, ns_ip)
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
