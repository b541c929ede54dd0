"""A Linux network-namespace testbed: a public namespace and private ones, joined through a core router.

Why namespaces: every other test runs on loopback, where every peer dials every other. Here each peer has its own
network stack, and reachability is what a home network or a cloud machine behind NAT gives:

    firewalled (nat=False)                          behind NAT (nat=True)
    pub 10.0.0.2 ── core ── 10.1.i.2 priv_i         pub 10.0.0.2 ── core ── 10.1.i.2 router_i ── 192.168.i.2 priv_i
    priv_i routes only to 10.0.0.0/24 (no route     router_i masquerades priv_i behind 10.1.i.2 and drops every
    to another private peer) and drops inbound      unsolicited inbound connection, like a home router; routers
    new connections: it dials out, nobody dials in  reach each other through core (hole punching can work)

Everything is created under names with this testbed's own prefix (two testbeds, or two test runs, never collide)
and removed by `close`, which also ends the processes this testbed started (by their process group, never by name).
Every wait is bounded. Needs root, `ip` and `nft`; `available()` says whether this machine has them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

_ENTER = ("import ctypes, os, runpy, sys; ns = sys.argv.pop(1); fd = os.open('/run/netns/' + ns, os.O_RDONLY); "
          "assert ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) == 0, 'cannot enter ' + ns; os.close(fd); "
          "sys.argv[0] = sys.argv.pop(1); runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def python_argv(ns: str, module: str, *args: str) -> list[str]:
    """Arguments for `python` that run `python -m module args` inside namespace `ns` (for callers that start the
    interpreter themselves, like swarm.bench.broadcast.EventProcess); the process joins the namespace first."""
    return ["-c", _ENTER, ns, module, *args]


PUBLIC_IP = "10.0.0.2"
"""The public namespace's one address: every bootstrap, relay and trainer multiaddr names it."""
_COMMAND_TIMEOUT = 10.0
_ICMP_UNLIMITED = "net.ipv4.icmp_ratelimit=0"
"""The core router answers every packet it has no route for with an ICMP error, like an internet router that
knows no 192.168.0.0/16. Why: py-libp2p's DCUtR first dials a relayed peer's listen addresses directly (behind NAT:
LAN addresses nobody outside can route) and moves on to hole punching only when those dials fail; with Linux's
default of one ICMP error a second per destination, the dials past the first few wait for SYN retransmits until
DCUtR's 10 s dial timeout, and punching starts that much later."""


def available() -> str | None:
    """None when namespaces can be built here, else one sentence saying what is missing."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (install.sh installs nftables when run as root)"
    return None


def _sh(*argv: str) -> None:
    """Run one setup command; a failure names the command and what it printed."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}")


@dataclass
class Testbed:
    """Namespaces for one test. Use as a context manager: `with Testbed(private=3, nat=True) as net: ...`."""

    private: int
    nat: bool = False
    prefix: str = field(default_factory=lambda: f"rs{uuid.uuid4().hex[:6]}")
    namespaces: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def public(self) -> str:
        return f"{self.prefix}-pub"

    @property
    def core(self) -> str:
        return f"{self.prefix}-core"

    def private_ns(self, i: int) -> str:
        return f"{self.prefix}-p{i}"

    def router_ns(self, i: int) -> str:
        return f"{self.prefix}-r{i}"

    def private_ip(self, i: int) -> str:
        """The address private peer i binds (behind NAT: its LAN address, which nobody outside can reach)."""
        return f"192.168.{i}.2" if self.nat else f"10.1.{i}.2"

    def public_face(self, i: int) -> str:
        """The address the public side sees private peer i's connections come from."""
        return f"10.1.{i}.2"

    def __enter__(self) -> Testbed:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------ building

    def _add_ns(self, name: str) -> None:
        _sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        _sh("ip", "-n", name, "link", "set", "lo", "up")

    def _link(self, a: str, a_if: str, a_ip: str, b: str, b_if: str, b_ip: str) -> None:
        """A veth pair created directly inside the two namespaces (no name ever lives in the root namespace)."""
        _sh("ip", "link", "add", a_if, "netns", a, "type", "veth", "peer", "name", b_if, "netns", b)
        for ns, ifname, ip in ((a, a_if, a_ip), (b, b_if, b_ip)):
            _sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", ifname)
            _sh("ip", "-n", ns, "link", "set", ifname, "up")

    def _build(self) -> None:
        self._add_ns(self.core)
        _sh("ip", "netns", "exec", self.core, "sysctl", "-qw", "net.ipv4.ip_forward=1", _ICMP_UNLIMITED)
        self._add_ns(self.public)
        self._link(self.core, "pub", "10.0.0.1", self.public, "core", PUBLIC_IP)
        _sh("ip", "-n", self.public, "route", "add", "default", "via", "10.0.0.1")
        for i in range(1, self.private + 1):
            (self._add_behind_nat if self.nat else self._add_firewalled)(i)

    def _add_firewalled(self, i: int) -> None:
        ns = self.private_ns(i)
        self._add_ns(ns)
        self._link(self.core, f"p{i}", f"10.1.{i}.1", ns, "core", self.private_ip(i))
        _sh("ip", "-n", ns, "route", "add", "10.0.0.0/24", "via", f"10.1.{i}.1")  # the public side only
        self._nft(ns, "add table inet fw",
                  "add chain inet fw input_wan { type filter hook input priority 0 ; }",
                  'add rule inet fw input_wan iifname "core" ct state new drop')

    def _add_behind_nat(self, i: int) -> None:
        ns, router = self.private_ns(i), self.router_ns(i)
        self._add_ns(router)
        self._add_ns(ns)
        self._link(self.core, f"p{i}", f"10.1.{i}.1", router, "wan", self.public_face(i))
        self._link(router, "lan", f"192.168.{i}.1", ns, "gw", self.private_ip(i))
        _sh("ip", "-n", router, "route", "add", "default", "via", f"10.1.{i}.1")
        _sh("ip", "-n", ns, "route", "add", "default", "via", f"192.168.{i}.1")
        _sh("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self._nft(router, "add table ip nat",
                  "add chain ip nat post { type nat hook postrouting priority 100 ; }",
                  'add rule ip nat post oifname "wan" masquerade',
                  "add table inet fw",
                  "add chain inet fw forward_wan { type filter hook forward priority 0 ; }",
                  'add rule inet fw forward_wan iifname "wan" ct state new drop',
                  "add chain inet fw input_wan { type filter hook input priority 0 ; }",
                  'add rule inet fw input_wan iifname "wan" ct state new drop')

    @staticmethod
    def _nft(ns: str, *rules: str) -> None:
        for rule in rules:
            _sh("ip", "netns", "exec", ns, "nft", *rule.split())

    # ----------------------------------------------------------------------------------------------- running

    def run(self, ns: str, argv: list[str], timeout: float = _COMMAND_TIMEOUT) -> subprocess.CompletedProcess:
        """Run a short command inside `ns` and wait for it (bounded)."""
        return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=timeout)

    def spawn(self, ns: str, argv: list[str], log: Path | None = None, **popen) -> subprocess.Popen:
        """Start a process inside `ns` in its own process group, so `close` ends it and its children only."""
        out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
        popen.setdefault("stdout", out)
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stderr=out, start_new_session=True, **popen)
        self.processes.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it past `grace` seconds."""
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """End this testbed's processes, then delete its namespaces (their veths and rules go with them)."""
        for proc in self.processes:
            try:
                self.stop(proc)
            except Exception:  # noqa: BLE001 - cleanup goes on for the rest
                pass
        self.processes.clear()
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=_COMMAND_TIMEOUT)
        self.namespaces.clear()
