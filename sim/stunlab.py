"""A tiny STUN server for the network lab (RFC 5389 Binding only), run as a command inside a site:

    python -m sim.stunlab ADDR PORT
        answer every Binding request on UDP ADDR:PORT with a Binding success response whose
        XOR-MAPPED-ADDRESS is the request's source address as seen here; print `listening` once bound.

Why the lab needs it: miniupnpd refuses to map ports while its external interface has a private
address (every lab address is private), unless `ext_perform_stun=yes` lets a STUN server tell it its
external address (sim/upnplab.py). The answer is the router's own WAN address, which the router's
requests come from. CHANGE-REQUEST is ignored (every answer comes from ADDR:PORT), which miniupnpd's
check of the NAT's filtering accepts as "not restrictive".

This module does not: answer anything but IPv4 Binding requests, authenticate, or relay (no TURN).
"""

from __future__ import annotations

import socket
import struct
import sys

MAGIC_COOKIE = 0x2112A442
BINDING_REQUEST, BINDING_SUCCESS = 0x0001, 0x0101
XOR_MAPPED_ADDRESS = 0x0020
HEADER = struct.Struct("!HHI12s")
"""type, length (bytes after the header), magic cookie, transaction id."""


def binding_response(request: bytes, source: tuple[str, int]) -> bytes | None:
    """The Binding success response to `request` from `source` (IPv4 host, port), or None when
    `request` is not a STUN Binding request."""
    if len(request) < HEADER.size:
        return None
    kind, _, cookie, txid = HEADER.unpack_from(request)
    if kind != BINDING_REQUEST or cookie != MAGIC_COOKIE:
        return None
    host = struct.unpack("!I", socket.inet_aton(source[0]))[0]
    attr = struct.pack("!HHBBHI", XOR_MAPPED_ADDRESS, 8, 0, 0x01,  # reserved, family IPv4
                       source[1] ^ (MAGIC_COOKIE >> 16), host ^ MAGIC_COOKIE)
    return HEADER.pack(BINDING_SUCCESS, len(attr), MAGIC_COOKIE, txid) + attr


def main(addr: str, port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((addr, port))
    print("listening", flush=True)
    while True:
        data, source = sock.recvfrom(2048)
        answer = binding_response(data, source)
        if answer is not None:
            sock.sendto(answer, source)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
