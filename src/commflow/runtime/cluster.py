"""Emulated hosts on one machine: Linux network namespaces joined by a bridge, links shaped
with ``tc``. The library behind ``commflow cluster up`` / ``down``.

:func:`up` creates, for ``hosts = N``:

- namespace ``commflow-sw`` holding the bridge ``br0`` (the switch; kept out of the root
  namespace so that the machine's own firewall and routes never see the traffic);
- namespaces ``commflow-h0 .. commflow-h{N-1}``, each with loopback up and a veth pair from its
  ``eth0`` to switch port ``h<i>``; host ``i`` has address ``198.18.0.<i+1>/15`` (RFC 2544's
  benchmarking range), so traffic goes nowhere but loopback and these hosts;
- a ``tbf`` token bucket at the link's rate on both ends of every veth pair (the host's egress
  and the switch port's egress toward it), as a full-duplex NIC of that rate;
- the description in ``/run/commflow/cluster.json``, which :func:`link_delay` reads.

This kernel has no ``netem``, so the link's one-way delay is emulated by commflow's engine
transport: ranks running inside a host namespace hold every message to another host ``delay``
seconds before sending it (:mod:`commflow.runtime.transport.engine`). ``commflow run --hosts
h0:2,h1:2`` starts ranks inside the namespaces. Creating and removing namespaces needs root.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from commflow.errors import CommflowError

STATE_FILE = Path("/run/commflow/cluster.json")
"""Where :func:`up` records the cluster it made."""

NETNS_DIR = Path("/run/netns")
"""Where ``ip netns`` keeps named namespaces."""

SWITCH = "commflow-sw"
"""The namespace of the bridge."""

MAX_HOSTS = 250
"""Most hosts one cluster may have."""

_HOST_NS = re.compile(r"commflow-h\d+")
_NETWORK = ipaddress.ip_network("198.18.0.0/15")
_QUEUE = "20ms"
_BURST_TIME = 2e-3
_MIN_BURST = 16 << 10


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """An emulated cluster: ``hosts`` namespaces behind one switch."""

    hosts: int
    """Number of emulated hosts (1 .. ``MAX_HOSTS``)."""
    ranks_per_host: int = 1
    """Ranks a job should place on each host (what ``commflow cluster up`` suggests)."""
    bandwidth: float
    """Rate of each host's link, each direction, in bytes/s."""
    delay: float = 0.0
    """One-way delay between hosts in seconds, added by commflow's engine transport."""

    def __post_init__(self) -> None:
        if not (isinstance(self.hosts, int) and 1 <= self.hosts <= MAX_HOSTS):
            raise CommflowError(f"a cluster needs 1 to {MAX_HOSTS} hosts, got {self.hosts!r}")
        if not (isinstance(self.ranks_per_host, int) and self.ranks_per_host >= 1):
            raise CommflowError(f"ranks per host must be >= 1, got {self.ranks_per_host!r}")
        if not (self.bandwidth * 8 >= 1000 and math.isfinite(self.bandwidth)):
            raise CommflowError(
                f"link bandwidth must be at least 1 kbit/s and finite, got "
                f"{self.bandwidth!r} bytes/s"
            )
        if not (0 <= self.delay <= 1):
            raise CommflowError(f"link delay must be 0 to 1 s, got {self.delay!r} s")

    def namespace(self, host: int) -> str:
        """The network namespace of ``host``."""
        return f"commflow-h{host}"

    def address(self, host: int) -> str:
        """The IPv4 address of ``host`` (in 198.18.0.0/15)."""
        return str(_NETWORK.network_address + host + 1)

    def hosts_arg(self) -> str:
        """The ``--hosts`` value of ``commflow run`` for this cluster, e.g. ``h0:2,h1:2``."""
        return ",".join(f"h{i}:{self.ranks_per_host}" for i in range(self.hosts))


def _run(command: str) -> str:
    """Run ``command`` (words split on spaces); ``CommflowError`` naming it and its error
    output when it fails."""
    done = subprocess.run(command.split(), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CommflowError(f"`{command}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _require_tools(action: str) -> None:
    if os.geteuid() != 0:
        raise CommflowError(
            f"commflow cluster {action} needs root (it manages network "
            f"namespaces): run it with sudo"
        )
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise CommflowError(
            f"commflow cluster {action} needs {' and '.join(missing)} from "
            f"iproute2: install it (apt-get install iproute2)"
        )


def _namespaces() -> list[str]:
    """The namespaces of a commflow cluster that exist now."""
    names = [line.split()[0] for line in _run("ip netns list").splitlines() if line]
    return sorted(n for n in names if n == SWITCH or _HOST_NS.fullmatch(n))


def _shape(namespace: str, device: str, bandwidth: float) -> None:
    burst = max(int(bandwidth * _BURST_TIME), _MIN_BURST)
    _run(
        f"tc -n {namespace} qdisc replace dev {device} root tbf rate {round(bandwidth * 8)}bit "
        f"burst {burst} latency {_QUEUE}"
    )


def up(spec: ClusterSpec) -> ClusterSpec:
    """Create the cluster ``spec`` describes, replacing any existing one; returns ``spec``.

    Raises ``CommflowError`` when not root, when ``ip``/``tc`` are missing or a step fails
    (whatever was made is removed again).
    """
    _require_tools("up")
    down()
    try:
        _run(f"ip netns add {SWITCH}")
        _run(f"ip -n {SWITCH} link set lo up")
        _run(f"ip -n {SWITCH} link add br0 type bridge")
        _run(f"ip -n {SWITCH} link set br0 up")
        for i in range(spec.hosts):
            ns, port = spec.namespace(i), f"h{i}"
            _run(f"ip netns add {ns}")
            _run(f"ip -n {ns} link set lo up")
            _run(f"ip link add name eth0 netns {ns} type veth peer name {port} netns {SWITCH}")
            _run(f"ip -n {SWITCH} link set {port} master br0 up")
            _run(f"ip -n {ns} addr add {spec.address(i)}/{_NETWORK.prefixlen} dev eth0")
            _run(f"ip -n {ns} link set eth0 up")
            _shape(ns, "eth0", spec.bandwidth)
            _shape(SWITCH, port, spec.bandwidth)
        STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
        STATE_FILE.write_text(json.dumps(asdict(spec)) + "\n")
    except BaseException:
        down()
        raise
    return spec


def down() -> list[str]:
    """Remove the cluster's namespaces (with their links) and its description; returns the
    namespaces removed (none when there was no cluster). Processes still inside a namespace
    keep it alive until they exit. Raises ``CommflowError`` when not root or ``ip`` fails."""
    _require_tools("down")
    removed = _namespaces()
    for name in removed:
        _run(f"ip netns delete {name}")
    STATE_FILE.unlink(missing_ok=True)
    return removed


def current() -> ClusterSpec | None:
    """The cluster :func:`up` recorded, or ``None`` when there is none."""
    try:
        return ClusterSpec(**json.loads(STATE_FILE.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as err:
        raise CommflowError(
            f"{STATE_FILE} is not a commflow cluster description ({err}); "
            f"run `commflow cluster down`"
        ) from None


def _inside(namespace: str) -> bool:
    """Whether this process runs in the named network namespace."""
    try:
        named = os.stat(NETNS_DIR / namespace)
    except FileNotFoundError:
        return False
    mine = os.stat("/proc/self/ns/net")
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)


def link_delay(env: Mapping[str, str]) -> float:
    """The one-way delay (s) the engine transport adds to each message between hosts:
    ``COMMFLOW_DELAY_US`` (microseconds) from ``env`` when set; else the cluster's delay when
    this process runs in the namespace of host ``COMMFLOW_HOST`` of the current cluster; else
    0. Raises ``CommflowError`` for a bad ``COMMFLOW_DELAY_US``."""
    text = env.get("COMMFLOW_DELAY_US")
    if text is not None:
        try:
            delay = float(text) * 1e-6
        except ValueError:
            delay = math.nan
        if not 0 <= delay <= 1:
            raise CommflowError(f"COMMFLOW_DELAY_US={text!r}: give microseconds from 0 to 1e6")
        return delay
    host = env.get("COMMFLOW_HOST", "")
    spec = current() if host.isdigit() else None
    if spec is None or not _inside(spec.namespace(int(host))):
        return 0.0
    return spec.delay
