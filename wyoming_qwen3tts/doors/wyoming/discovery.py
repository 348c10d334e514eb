"""Zeroconf (mDNS) announcement of the Wyoming service as ``_wyoming._tcp.local.``."""

from __future__ import annotations

import ipaddress
import logging
import socket

import ifaddr
from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

_LOGGER = logging.getLogger(__name__)

SERVICE_TYPE = "_wyoming._tcp.local."
#: The mDNS group; the route to it is the interface the announcement goes out on.
_MDNS_GROUP = ("224.0.0.251", 5353)


def lan_address() -> str:
    """The IPv4 address other hosts reach this one on, never 0.0.0.0.

    First the source address of the route to the mDNS group (a UDP ``connect`` sends no
    packet), then any non-loopback interface address (ifaddr), then 127.0.0.1.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(_MDNS_GROUP)
            address = probe.getsockname()[0]
            if address and not ipaddress.ip_address(address).is_unspecified:
                return str(address)
        except OSError:
            pass
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ipaddress.ip_address(ip.ip).is_loopback:
                return ip.ip
    return "127.0.0.1"


def advertised_address(bind_host: str) -> str:
    """The address to announce for a server bound to ``bind_host``."""
    try:
        if ipaddress.ip_address(bind_host).is_unspecified:
            return lan_address()
    except ValueError:  # a host name
        return socket.gethostbyname(bind_host)
    return bind_host


def _is_local(address: str) -> bool:
    """Whether ``address`` is one of this machine's (a socket can be bound to it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


class Announcer:
    """Registers the service while the server runs.

    Args:
        name: service instance name (shown in Home Assistant's discovery).
        host: the address announced: the server's bind address ("0.0.0.0" = this
            machine's LAN address), or a load balancer's (``--zeroconf-address``).
        port: the Wyoming TCP port announced (the server's, or the balancer's).
    """

    def __init__(self, name: str, host: str, port: int) -> None:
        self.address = advertised_address(host)
        self.info = AsyncServiceInfo(
            SERVICE_TYPE,
            f"{name}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(self.address)],
            port=port,
            server=f"{socket.gethostname()}.local.",
        )
        self._zeroconf: AsyncZeroconf | None = None

    async def start(self) -> None:
        """Announce the service on the interface of ``self.address`` (this machine's LAN
        interface when that address is another machine's: a load balancer's)."""
        interface = self.address if _is_local(self.address) else lan_address()
        self._zeroconf = AsyncZeroconf(interfaces=[interface], ip_version=IPVersion.V4Only)
        await self._zeroconf.async_register_service(self.info)
        _LOGGER.info("Zeroconf: %s at %s:%s", self.info.name, self.address, self.info.port)

    async def stop(self) -> None:
        """Withdraw the announcement (mDNS goodbye packets, TTL 0), then close."""
        if self._zeroconf is not None:
            zeroconf, self._zeroconf = self._zeroconf, None
            goodbyes = await zeroconf.async_unregister_service(self.info)
            await goodbyes  # sent (closing first would cancel them)
            await zeroconf.async_close()
            _LOGGER.info("Zeroconf: withdrew %s", self.info.name)
