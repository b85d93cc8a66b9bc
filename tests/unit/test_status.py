"""swarm.client.status: peers that do not answer a ping are shown so and routed around (pure part)."""

from __future__ import annotations

import dataclasses

from swarm.client.status import status_report
from swarm.dht.records import Announcement


def ann(peer_id: str, start: int, end: int, steps_per_s: float) -> Announcement:
    return Announcement(peer_id=peer_id, addrs=(), model_id="ab" * 8, start=start, end=end,
                        decode_steps_per_s=steps_per_s, prefill_tokens_per_s=900.0,
                        free_cache_tokens=4096, max_sessions=8, sessions_free=8, version="0",
                        protocol=4, public_name="", expires_at=1.7e9)


PEERS = [ann("fast-whole", 0, 30, 100.0), ann("a", 0, 15, 50.0), ann("b", 15, 30, 50.0)]


def test_without_pings_every_announcement_counts():
    report = status_report("ab" * 8, 30, PEERS)
    assert [h.peer_id for h in report.best_route.hops] == ["fast-whole"]
    assert report.silent == [] and report.rtt_ms == {}


def test_a_peer_that_did_not_answer_is_shown_and_routed_around(capsys):
    report = status_report("ab" * 8, 30, PEERS, {"fast-whole": None, "a": 1.5, "b": 2.0})
    assert [h.peer_id for h in report.best_route.hops] == ["a", "b"]
    assert [p.peer_id for p in report.silent] == ["fast-whole"]
    assert report.chains.complete and report.covered
    assert report.verdict()[-1].startswith("no answer: 0:30 on fast-whole")
    assert report.verdict()[1].startswith("route exists: best 0:15 (a…) → 15:30 (b…), ~")
    rows = {p["peer_id"]: (p["answered"], p["rtt_ms"]) for p in report.to_dict()["peers"]}
    assert rows == {"fast-whole": (False, None), "a": (True, 1.5), "b": (True, 2.0)}
    report.print_table()
    out = capsys.readouterr().out
    assert "no answer" in out and " 1.5 " in out


def test_only_silent_peers_on_a_layer_leave_it_uncovered():
    report = status_report("ab" * 8, 30, [PEERS[0], PEERS[1]], {"fast-whole": None, "a": 1.0})
    assert not report.covered and report.best_route is None
    assert dataclasses.asdict(report.silent[0])["peer_id"] == "fast-whole"


def test_when_no_announced_peer_answers_the_report_says_so():
    report = status_report("ab" * 8, 30, PEERS, {p.peer_id: None for p in PEERS})
    assert report.best_route is None
    assert report.no_route.startswith("layers 0:30 are announced, but by no peer that answers: 3 peer(s)")
    assert len(report.silent) == 3 and not report.covered


def test_layers_only_silent_peers_serve_are_announced_but_unreachable_not_missing():
    private = dataclasses.replace(PEERS[2], reachability="private")
    report = status_report("ab" * 8, 30, [PEERS[1], private], {"a": 1.0, "b": None},
                           transport={"a": "direct"})
    lines = report.verdict()
    assert report.unreachable_layers == list(range(15, 30)) and report.uncovered_layers == []
    assert lines[0].startswith("layers 15:30 announced but unreachable: 1 peer(s) serving them did not "
                               "answer (it announces private reachability: behind a NAT")
    assert not any(line.startswith("layers not covered") for line in lines)
    d = report.to_dict()
    assert d["unreachable_layers"] == list(range(15, 30)) and "forward their ports" in d["unreachable_why"]
    assert [(p["peer_id"], p["transport"], p["reachability"]) for p in d["peers"]] == [
        ("a", "direct", "unknown"), ("b", "", "private")]


def test_the_best_route_names_each_hops_transport_and_weighs_measured_rtt():
    report = status_report("ab" * 8, 30, PEERS, {"fast-whole": 40.0, "a": 1.0, "b": 1.0},
                           transport={"fast-whole": "libp2p", "a": "direct", "b": "libp2p"})
    # compute alone prefers fast-whole (10 ms vs 2 x 20 ms); its 40 ms round trip makes a → b (42 ms) cheaper (50 ms)
    assert [h.peer_id for h in report.best_route.hops] == ["a", "b"]
    assert report.verdict()[1].startswith("route exists: best 0:15 (a…, direct) → 15:30 (b…, libp2p), ~")
    assert report.to_dict()["best_route"]["transports"] == ["direct", "libp2p"]


def test_the_table_fits_80_columns_one_line_per_peer():
    from io import StringIO

    from rich.console import Console

    long = [dataclasses.replace(p, peer_id=p.peer_id * 20, public_name="a rather long public name")
            for p in PEERS]
    report = status_report("ab" * 8, 30, long, {p.peer_id: 123.4 for p in long},
                           transport={p.peer_id: "libp2p" for p in long})
    out = StringIO()
    report.print_table(Console(file=out, width=80, color_system=None))
    table = out.getvalue().split("all layers covered")[0].rstrip("\n").splitlines()
    assert max(len(line) for line in table) <= 80
    assert len(table) == 2 + len(long)  # title, header, one line per peer: nothing wrapped
    assert all("libp2p" in line and "123.4" in line for line in table[2:])
