"""Real libtorrent sessions on 127.0.0.1 moving real SmolLM2 bytes: span fetch, swarming, bad
peers, resume, failures. libtorrent's DHT/LSD/UPnP/NAT-PMP are off; fetches poll with deadlines."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import shutil
import socket
import subprocess
from pathlib import Path

import libtorrent as lt
import pytest
from gguf import GGUFReader

from swarm.artifacts.plan import (
    pieces_bytes,
    pieces_for_ranges,
    span_byte_ranges,
    span_tensors,
    tensors_touching_piece,
)
from swarm.artifacts.records import (
    SeederRecord,
    decode_manifest,
    decode_seeder,
    encode_manifest,
    encode_seeder,
)
from swarm.artifacts.session import ArtifactSession, SessionConfig
from swarm.artifacts.torrent import make_torrent, parse_torrent
from swarm.artifacts.verify import verify_file
from swarm.errors import ArtifactError, ProtocolError
from swarm.manifest import build_manifest

SPAN = (10, 20)


@pytest.fixture(scope="module")
def manifest(smollm2_path):
    return build_manifest(smollm2_path)


@pytest.fixture(scope="module")
def torrent(smollm2_path, manifest):
    return make_torrent(smollm2_path, manifest)


@pytest.fixture(scope="module")
def seeder(smollm2_path, torrent):
    with ArtifactSession() as ses:
        ses.seed(smollm2_path, torrent.data)
        yield ses


@pytest.fixture(scope="module")
def first_fetch(seeder, torrent, manifest, tmp_path_factory):
    """A fresh peer fetches span 10:20 from the seeder and keeps serving it for the module."""
    ranges = span_byte_ranges(manifest, *SPAN, need_embd=False, need_head=False)
    with ArtifactSession() as ses:
        result = ses.fetch(
            torrent.data,
            manifest,
            tmp_path_factory.mktemp("f1") / "model.gguf",
            ranges,
            [seeder.address],
            timeout_s=120,
            progress=False,
        )
        yield ses, result, ranges


def _sha(path: Path, off: int, n: int) -> str:
    with open(path, "rb") as f:
        f.seek(off)
        return hashlib.sha256(f.read(n)).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torrent_is_content_named_and_hybrid(torrent, manifest, smollm2_path):
    assert torrent.name == manifest.model_id
    assert torrent.file_size == manifest.file_size == 98_362_432
    assert torrent.piece_size == 256 << 10
    hashes = torrent.info.info_hashes()
    assert hashes.has_v1() and hashes.has_v2()
    with open(smollm2_path, "rb") as f:
        first_piece = f.read(torrent.piece_size)
    assert torrent.info.hash_for_piece(0) == hashlib.sha1(first_piece).digest()


def test_span_fetch_downloads_only_its_pieces_and_verifies(first_fetch, manifest, torrent, tmp_path):
    _, result, ranges = first_fetch
    needed = sum(n for _, n in ranges)
    ratio = result.downloaded_bytes / needed
    print(
        f"span {SPAN}: needed {needed} B (header + tensors), downloaded {result.downloaded_bytes} B, "
        f"overfetch ratio {ratio:.4f}, {result.elapsed_s:.2f} s"
    )
    pieces = pieces_for_ranges(ranges, torrent.piece_size, torrent.file_size)
    assert result.wanted_bytes == pieces_bytes(pieces, torrent.piece_size, torrent.file_size)
    assert needed <= result.downloaded_bytes <= 1.1 * needed
    assert result.failed_pieces == () and result.banned_peers == ()
    path = result.path
    assert path.name == "model.gguf" and not path.with_name("model.gguf.part").exists()
    assert not path.with_name("model.gguf.resume").exists()
    assert _sha(path, 0, manifest.data_offset) == manifest.header_sha256
    for t in span_tensors(manifest, *SPAN, need_embd=False, need_head=False):
        assert _sha(path, t.offset, t.nbytes) == t.sha256, t.name
    # the file is sparse: a tensor outside the span was never fetched
    embd = manifest.tensor("token_embd.weight")
    assert _sha(path, embd.offset, embd.nbytes) != embd.sha256
    assert path.stat().st_blocks * 512 < 0.5 * manifest.file_size


def test_verify_file_names_what_does_not_match(first_fetch, manifest, tmp_path):
    _, result, ranges = first_fetch
    verify_file(result.path, manifest, ranges)
    embd = manifest.tensor("token_embd.weight")
    with pytest.raises(ArtifactError, match="tensor token_embd.weight does not match"):
        verify_file(result.path, manifest, [(embd.offset, embd.nbytes)])
    short = tmp_path / "short.gguf"
    short.write_bytes(result.path.read_bytes()[:1000])
    with pytest.raises(ArtifactError, match="header does not match"):
        verify_file(short, manifest, ranges)
    with pytest.raises(ArtifactError, match="cannot read"):
        verify_file(tmp_path / "absent.gguf", manifest, ranges)


def test_span_builds_from_the_sparse_file(first_fetch, smollm2_path, manifest, tmp_path):
    slicing = pytest.importorskip("swarm.ggml_bridge.slicing", reason="swarm.ggml_bridge.slicing missing")
    _, result, _ = first_fetch
    mid = manifest.model_id
    sparse = GGUFReader(slicing.build_span(result.path, *SPAN, cache_dir=tmp_path / "a", model_id=mid))
    whole = GGUFReader(slicing.build_span(smollm2_path, *SPAN, cache_dir=tmp_path / "b", model_id=mid))
    assert list(sparse.fields) == list(whole.fields)
    # Every tensor a middle span computes with is identical. (slicing also copies `output_norm`
    # into middle spans, where llama.cpp loads but never uses it; the span's fetch skips it.)
    names = [t.name for t in whole.tensors]
    assert names == [t.name for t in sparse.tensors] and sum(n.startswith("blk.") for n in names) == 90
    for a, b in zip(sparse.tensors, whole.tensors):
        if a.name != "output_norm.weight":
            assert a.data.tobytes() == b.data.tobytes(), a.name


def test_second_fetcher_swarms_from_seeder_and_first_fetcher(
    first_fetch, seeder, torrent, manifest, tmp_path
):
    ses1, _, ranges = first_fetch
    # a download cap keeps the transfer long enough (~1.5 s) for both peers to be asked for pieces
    with ArtifactSession(SessionConfig(download_limit_bytes_per_s=16 << 20)) as ses2:
        result = ses2.fetch(
            torrent.data,
            manifest,
            tmp_path / "m.gguf",
            ranges,
            [seeder.address, ses1.address],
            timeout_s=120,
            progress=False,
        )
    by_peer = result.bytes_by_peer
    print(f"second fetcher got {by_peer}")
    assert by_peer.get(f"127.0.0.1:{seeder.port}", 0) > 0
    assert by_peer.get(f"127.0.0.1:{ses1.port}", 0) > 0
    assert sum(by_peer.values()) == result.wanted_bytes <= result.downloaded_bytes  # + endgame duplicates


def test_metadata_by_infohash_is_enough_to_fetch(seeder, torrent, manifest, tmp_path):
    ranges = span_byte_ranges(manifest, 28, 30, need_embd=False, need_head=True)
    with ArtifactSession() as ses:
        data = ses.fetch_metadata(torrent.infohash, manifest, [seeder.address], timeout_s=30)
        assert parse_torrent(data, manifest).infohash == torrent.infohash and len(data) < len(torrent.data)
        result = ses.fetch(
            data, manifest, tmp_path / "m.gguf", ranges, [seeder.address], timeout_s=60, progress=False
        )
        for t in span_tensors(manifest, 28, 30, need_embd=False, need_head=True):
            assert _sha(result.path, t.offset, t.nbytes) == t.sha256, t.name
        other = dataclasses.replace(manifest, n_embd=manifest.n_embd + 1)
        with pytest.raises(ArtifactError, match="not " + other.model_id[:16]):
            ses.fetch_metadata(torrent.infohash, other, [seeder.address])
    with ArtifactSession() as lonely:
        with pytest.raises(ArtifactError, match="metadata .* timed out"):
            lonely.fetch_metadata(torrent.infohash, manifest, [], timeout_s=1)
        with pytest.raises(ArtifactError, match="bad info-hash"):
            lonely.fetch_metadata("xyz", manifest, [])


def test_corrupt_peer_is_detected_banned_and_bypassed(smollm2_path, manifest, torrent, tmp_path, caplog):
    span = (10, 12)
    bad_copy = tmp_path / "bad" / "model.gguf"
    bad_copy.parent.mkdir()
    shutil.copyfile(smollm2_path, bad_copy)
    ranges = span_byte_ranges(manifest, *span, need_embd=False, need_head=False)
    first_tensor = span_tensors(manifest, *span, need_embd=False, need_head=False)[0]
    with (
        ArtifactSession(SessionConfig(upload_limit_bytes_per_s=2 << 20)) as honest,
        ArtifactSession() as bad,
        ArtifactSession() as fetcher,
    ):
        honest.seed(smollm2_path, torrent.data)
        bad.seed(bad_copy, torrent.data)  # checked while intact; now corrupt what it serves
        with open(bad_copy, "r+b") as f:
            for piece in pieces_for_ranges(ranges, torrent.piece_size, torrent.file_size):
                off = max(piece * torrent.piece_size, first_tensor.offset)
                f.seek(off)
                byte = f.read(1)
                f.seek(off)
                f.write(bytes([byte[0] ^ 0xFF]))
        caplog.set_level(logging.WARNING, logger="swarm.artifacts")
        bad_addr, honest_addr = f"127.0.0.1:{bad.port}", f"127.0.0.1:{honest.port}"
        result = fetcher.fetch(
            torrent.data,
            manifest,
            tmp_path / "out.gguf",
            ranges,
            [bad.address, honest.address],
            timeout_s=120,
            progress=False,
        )
    assert result.failed_pieces, "the corrupt peer sent no piece; the test proved nothing"
    assert bad_addr in result.banned_peers
    assert result.banned_peers == (bad_addr,) and result.bytes_by_peer[honest_addr] > 0
    for t in span_tensors(manifest, *span, need_embd=False, need_head=False):
        assert _sha(result.path, t.offset, t.nbytes) == t.sha256, t.name
    text = caplog.text
    for piece in result.failed_pieces:
        touched = tensors_touching_piece(manifest, piece, torrent.piece_size)
        # the span's blocks, or a global tensor every span carries (output_norm)
        assert any(n.startswith(("blk.10.", "blk.11.")) or manifest.tensor(n).layer is None for n in touched)
        assert f"piece {piece} failed its hash check (touches {', '.join(touched)}); sent by" in text
    assert f"sent by {bad_addr}" in text
    assert f"banned peer {bad_addr}" in text


def test_interrupted_fetch_resumes_without_refetching(seeder, torrent, manifest, tmp_path):
    ranges = span_byte_ranges(manifest, 0, 30, need_embd=False, need_head=True)
    dest = tmp_path / "r.gguf"

    class Interrupted(Exception):
        pass

    def interrupt_at_a_quarter(done: int, wanted: int) -> None:
        # by progress, not by a timeout: a loaded machine may not connect within any fixed time
        if done >= wanted // 4:
            raise Interrupted

    with ArtifactSession(SessionConfig(download_limit_bytes_per_s=16 << 20)) as slow:
        with pytest.raises(ArtifactError, match=r"timed out with \d+ of \d+ bytes \(resumable\)"):
            slow.fetch(torrent.data, manifest, dest, ranges, [seeder.address], timeout_s=0.0, progress=False)
        with pytest.raises(Interrupted):
            slow.fetch(
                torrent.data,
                manifest,
                dest,
                ranges,
                [seeder.address],
                progress=False,
                on_progress=interrupt_at_a_quarter,
            )
    assert not dest.exists(), "a partial span must never appear under the final name"
    assert dest.with_name("r.gguf.part").exists()
    have = lt.read_resume_data(dest.with_name("r.gguf.resume").read_bytes()).have_pieces
    had = sum(have)
    assert 0 < had < len(pieces_for_ranges(ranges, torrent.piece_size, torrent.file_size))
    # exact bytes of the kept pieces: the file's last piece is shorter than piece_size
    had_bytes = pieces_bytes([i for i, ok in enumerate(have) if ok], torrent.piece_size, torrent.file_size)
    with ArtifactSession() as again:
        result = again.fetch(
            torrent.data, manifest, dest, ranges, [seeder.address], timeout_s=120, progress=False
        )
    print(
        f"resume: first run kept {had} pieces; second run downloaded {result.downloaded_bytes} "
        f"of {result.wanted_bytes} B"
    )
    # no piece the first run had was fetched again (blocks of its unfinished pieces were kept too)
    fetched = sum(result.bytes_by_peer.values())
    assert 0 < fetched <= result.wanted_bytes - had_bytes
    assert result.path == dest and not dest.with_name("r.gguf.resume").exists()
    # fetching again into the same dest (same session) re-checks the file and downloads nothing
    with ArtifactSession() as third:
        again = third.fetch(torrent.data, manifest, dest, ranges, [seeder.address], progress=False)
        assert again.downloaded_bytes == 0 and again.path == dest
        middle = span_byte_ranges(manifest, *SPAN, need_embd=False, need_head=False)
        again = third.fetch(torrent.data, manifest, dest, middle, [seeder.address], progress=False)
        assert again.downloaded_bytes == 0 and again.wanted_bytes < result.wanted_bytes
    for t in span_tensors(manifest, 0, 30, need_embd=False, need_head=True):
        assert _sha(dest, t.offset, t.nbytes) == t.sha256, t.name


def test_no_seeders_fails_by_the_stall_timeout(torrent, manifest, tmp_path):
    ranges = span_byte_ranges(manifest, *SPAN, need_embd=False, need_head=False)
    # the stall timeout (1.5 s, printed rounded) ends the fetch, not the whole call's timeout_s
    stalled = r"no seeder sent data for 2 s \(0 connected, 0 of \d+ bytes\)"
    with ArtifactSession() as ses:
        for peers in ([], [("127.0.0.1", _free_port())]):
            with pytest.raises(ArtifactError, match=stalled):
                ses.fetch(
                    torrent.data,
                    manifest,
                    tmp_path / "n.gguf",
                    ranges,
                    peers,
                    timeout_s=600,
                    stall_timeout_s=1.5,
                    progress=False,
                )
        with pytest.raises(ArtifactError, match="bad peer address"):
            ses.fetch(torrent.data, manifest, tmp_path / "n.gguf", ranges, [("not-an-ip", 1)], progress=False)
    assert not (tmp_path / "n.gguf").exists()


def test_garbage_or_foreign_torrent_is_refused(torrent, manifest, tmp_path, smollm2_path):
    with ArtifactSession() as ses:
        for junk in (b"", b"garbage", b"d4:infod4:name3:abcee", torrent.data[:-10]):
            with pytest.raises(ArtifactError):
                ses.fetch(junk, manifest, tmp_path / "g.gguf", [(0, 10)], [], progress=False)
    other = make_torrent(smollm2_path, dataclasses.replace(manifest, n_embd=manifest.n_embd + 1))
    with pytest.raises(ArtifactError, match="not " + manifest.model_id[:16]):
        parse_torrent(other.data, manifest)


def test_seeding_a_file_that_does_not_match_fails(torrent, smollm2_path, tmp_path):
    bad = tmp_path / "short.gguf"
    bad.write_bytes(b"\0" * 1000)
    with ArtifactSession() as ses:
        with pytest.raises(ArtifactError, match="not 98362432 bytes"):
            ses.seed(bad, torrent.data)
        zeros = tmp_path / "zeros.gguf"
        with open(zeros, "wb") as f:
            f.truncate(torrent.file_size)
        with pytest.raises(ArtifactError, match="pieces match the torrent|does not match"):
            ses.seed(zeros, torrent.data)


@pytest.fixture
def tiny_disk(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a 4 MiB tmpfs here (needs root) to fill a disk")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_full_disk_is_a_clear_error(tiny_disk, seeder, torrent, manifest):
    ranges = span_byte_ranges(manifest, *SPAN, need_embd=False, need_head=False)
    with ArtifactSession() as ses:
        with pytest.raises(ArtifactError, match="disk full"):
            ses.fetch(
                torrent.data,
                manifest,
                tiny_disk / "m.gguf",
                ranges,
                [seeder.address],
                timeout_s=60,
                progress=False,
            )
    assert not (tiny_disk / "m.gguf").exists()


def test_records_round_trip_and_reject_bad_input(torrent, manifest):
    rec = SeederRecord(infohash=torrent.infohash, host="127.0.0.1", port=6881, torrent=torrent.data)
    assert decode_seeder(encode_seeder(rec), manifest.model_id) == rec
    small = SeederRecord(infohash=torrent.infohash, host="::1", port=6881)
    assert decode_seeder(encode_seeder(small), manifest.model_id) == small and len(encode_seeder(small)) < 100
    assert decode_manifest(encode_manifest(manifest), manifest.model_id) == manifest
    with pytest.raises(ProtocolError, match="not " + "0" * 16):
        decode_seeder(encode_seeder(rec), "0" * 64)
    with pytest.raises(ProtocolError, match="infohash"):
        decode_seeder(encode_seeder(SeederRecord("ab" * 20, "127.0.0.1", 1, torrent.data)), manifest.model_id)
    with pytest.raises(ProtocolError, match="40 lowercase hex"):
        encode_seeder(SeederRecord("AB" * 20, "127.0.0.1", 1))
    with pytest.raises(ProtocolError, match="not an IP"):
        encode_seeder(SeederRecord(torrent.infohash, "example.com", 1))
    with pytest.raises(ProtocolError, match="port"):
        encode_seeder(SeederRecord(torrent.infohash, "127.0.0.1", 0))
    with pytest.raises(ProtocolError):
        decode_manifest(encode_manifest(manifest), "f" * 64)
    for junk in (b"", b"\xc1", b"\x93\x01\x02\x03", b"\x81\xa1v\x02", b"x" * (5 << 20)):
        with pytest.raises(ProtocolError):
            decode_seeder(junk, manifest.model_id)
        with pytest.raises(ProtocolError):
            decode_manifest(junk, manifest.model_id)
