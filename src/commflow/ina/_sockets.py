"""UDP sockets of the switch and its workers: large buffers, and the multicast group on which
a job's workers take the switch's results (one send reaching all of them)."""

from __future__ import annotations

import ipaddress
import socket

from commflow.ina.protocol import InaError

Address = tuple[str, int]


def _buffers(sock: socket.socket, size: int) -> None:
    """``size`` bytes of send and receive buffer (beyond ``net.core.rmem_max`` as root)."""
    for force, opt in ((33, socket.SO_RCVBUF), (32, socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)  # SO_RCVBUFFORCE, SO_SNDBUFFORCE
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)


def open_socket(host: str, port: int, buffer: int = 4 << 20) -> socket.socket:
    """A blocking UDP socket bound to ``host:port`` with ``buffer`` bytes of send and receive
    buffer (beyond ``net.core.rmem_max`` when run as root, else as far as the kernel
    allows). Multicast sends leave through ``host``'s interface when ``host`` is an address."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _buffers(sock, buffer)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise InaError(f"ina: cannot bind UDP {host}:{port} ({e.strerror}); choose another "
                       "--port, or 0 for any free one") from None
    if host not in ("", "0.0.0.0"):
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(host))
    return sock


def check_group(group: Address, who: str) -> Address:
    """``group`` as ``(IPv4 multicast address, port)``; raises ``InaError`` naming ``who``."""
    try:
        host, port = str(group[0]), int(group[1])
        multicast = ipaddress.IPv4Address(host).is_multicast
    except (ValueError, IndexError, TypeError) as e:
        raise InaError(f"{who}: bad group {group!r} ({e}); pass (multicast address, port)"
                       ) from None
    if not multicast or not 0 < port < 65536:
        raise InaError(f"{who}: group {host}:{port} is not an IPv4 multicast address "
                       "(224.0.0.0/4) and a port in [1, 65535]; e.g. ('239.255.18.1', 9998)")
    return host, port


def open_group(group: Address, switch: Address, buffer: int) -> socket.socket:
    """A UDP socket that takes the datagrams sent to the multicast ``group`` on the interface
    through which ``switch`` is reached (several workers on one host may share the port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(switch)
        local = probe.getsockname()[0]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _buffers(sock, buffer)
    try:
        sock.bind(group)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                        socket.inet_aton(group[0]) + socket.inet_aton(local))
    except OSError as e:
        sock.close()
        raise InaError(f"ina: cannot join multicast group {group[0]}:{group[1]} on {local} "
                       f"({e.strerror}); choose another group or port") from None
    return sock
