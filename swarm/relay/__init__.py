"""Relayed streams: a peer behind a NAT serves through a reachable peer, sealed end to end.

A peer that accepts no inbound connection keeps one outbound control connection to a relay (a
reachable peer offering the service); a client or a pushing peer asks the relay for it, the relay
tells it over the control connection to open a data connection, and splices the two TCP connections
byte for byte. The two ends then run a Noise XX handshake over the spliced pipe, each signing its
Noise static key with its libp2p identity key (as libp2p's own Noise handshake does), so each knows
the other's peer id and the relay can neither read nor alter a frame; frames are then sealed with
swarm.direct's `AeadFrameCipher`, and a stream handler cannot tell a relayed stream from a direct one.

Modules:
    records.py    pure: relay offers in the DHT, relay addresses, and the relay's hello messages
    rules.py      pure: who relays and who is relayed, the relay's budget, token buckets, relay choice
    handshake.py  the end-to-end handshake over a relayed pipe (Noise XX + identity signatures)
    service.py    the relay: registrations, splicing within the budget, the offer it publishes
    dial.py       a client's or pushing peer's relayed stream (and relayed ping)
    registrar.py  the relayed peer: chooses a relay, stays registered, answers dial requests

This package does not: decide routes, or read what the frames mean.
"""
