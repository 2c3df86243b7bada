"""Shared rings between ranks on one host: used when they can be, off when asked, and
safe against a peer that offers or names what it should not.

The attacks play rank 1 of a group from Python (tests/wire_client.py's PythonRank, a grpcio
client built from protos/): it opens the group's point-to-point stream to rank 0, offers a
ring (of its own, or a file of rank 0's own process), switches to it, and sends records in
its queue that name slots in it; or names a slot on the stream, which no rank does. The file layout they write is the one
csrc/transport/shared_ring.cc defines and protos/torch_grpc_pg.proto describes.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import platform
import struct
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dist_harness import (
    RankContext,
    backend_under_test,
    init_default_group,
    init_groups,
    run_ranks,
    store_barrier,
)
from reference import (
    assert_reduced,
    assert_same_as_gloo,
    make_input,
    reduce_reference,
    seed_of,
)
from torch_grpc_pg import status

pytestmark = pytest.mark.skipif(
    backend_under_test() != "grpc", reason="the grpc backend's same-host data path"
)

# Four chunks of the default 2 MiB per rank's segment, plus an odd tail.
NUMEL = (8 << 20) // 4 + 5


def _backend(group: dist.ProcessGroup | None = None) -> Any:
    return (group or dist.group.WORLD)._get_backend(torch.device("cpu"))


def _own_status(backend: Any) -> Any:
    """This rank's default group as the status tool reads it from the rank's server."""
    (read,) = status.read_ranks([backend.tcp_address], status.Credentials(), 30)
    assert read.reply is not None, read.error
    (group,) = [g for g in read.reply.groups if g.group_key == backend.group_key]
    return group


# --------------------------------------------------------------------------- use


def _traffic(ctx: RankContext, env: dict[str, str], numel: int) -> dict[str, Any]:
    os.environ.update(env)
    gloo = init_groups(ctx)
    # A link offers its ring with its first frame, so the first frames through the
    # links (an all-to-all's: collectives with a schedule in the group's segment
    # use no link) go through the socket; the counters below start after them.
    dist.all_to_all_single(torch.empty(ctx.world_size), torch.ones(ctx.world_size))
    before = _own_status(_backend())
    inputs = [
        make_input(seed_of("shared-ring", r), r, numel, torch.float32)
        for r in range(ctx.world_size)
    ]
    tensor = inputs[ctx.rank].clone()
    dist.all_reduce(tensor)
    reference = inputs[ctx.rank].clone()
    dist.all_reduce(reference, group=gloo)
    assert_reduced(
        tensor, reduce_reference(inputs, "SUM"), "SUM", ctx.world_size, "all_reduce"
    )
    assert_same_as_gloo(tensor, reference, "SUM", ctx.world_size)

    root = ctx.world_size - 1
    broadcast = inputs[ctx.rank].clone()
    dist.broadcast(broadcast, src=root)
    assert torch.equal(broadcast, inputs[root]), "broadcast differs from the root's"

    # An all-to-all has no schedule in the group's segment: it goes through the
    # links, and so through their rings.
    split = torch.arange(numel * ctx.world_size, dtype=torch.float32) + ctx.rank
    exchanged = torch.empty_like(split)
    dist.all_to_all_single(exchanged, split)
    exchanged_by_gloo = torch.empty_like(split)
    dist.all_to_all_single(exchanged_by_gloo, split, group=gloo)
    assert torch.equal(exchanged, exchanged_by_gloo), "all_to_all differs from gloo's"

    after = _own_status(_backend())
    return {
        "sent": after.bytes_sent - before.bytes_sent,
        "shared": after.bytes_sent_shared - before.bytes_sent_shared,
    }


@pytest.mark.parametrize(
    ("env", "expect_shared"),
    [
        ({}, True),
        ({"TORCH_GRPC_PG_SHARED_MEMORY": "0"}, False),
        ({"TORCH_GRPC_PG_UNIX_SOCKETS": "0"}, False),
    ],
    ids=["default", "shared-memory-off", "tcp-only"],
)
# Small messages take the rings too: the direct schedule, to every peer, and records.
@pytest.mark.parametrize("numel", [NUMEL, 3], ids=["chunks", "three-floats"])
@pytest.mark.parametrize("world", [2, 3])
def test_frames_between_ranks_on_one_host_go_through_shared_rings(
    world: int, numel: int, env: dict[str, str], expect_shared: bool
) -> None:
    for res in run_ranks(_traffic, world, env, numel):
        counters = res.value
        assert counters["sent"] >= numel * 4 // world, (res.rank, counters)
        if expect_shared:
            # Once the ring is mapped every frame goes through it: chunks through its
            # slots, waiting for one when the receiver holds them all, and payloads
            # small enough for a record inline in the record.
            assert counters["shared"] == counters["sent"], (res.rank, counters)
        else:
            assert counters["shared"] == 0, (res.rank, counters)


def _threads_by_name() -> dict[str, list[int]]:
    """Voluntary context switches of each of this process's threads, by thread name."""
    threads: dict[str, list[int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/status") as f:
                status_text = f.read()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        (line,) = [x for x in status_text.splitlines() if x.startswith("voluntary")]
        threads.setdefault(name, []).append(int(line.split()[1]))
    return threads


def _idle_wakes(ctx: RankContext, idle_s: float) -> dict[str, Any]:
    init_groups(ctx)
    # An all-to-all goes through the links (the group's segment carries the
    # collectives it has a schedule for), so each rank's rings from its peers
    # have readers.
    for _ in range(3):
        dist.all_to_all_single(torch.empty(ctx.world_size), torch.ones(ctx.world_size))
    # Every rank has received all it will: from here on nothing is sent.
    store_barrier(ctx.store(), ctx.world_size, "idle")
    before = _threads_by_name()
    time.sleep(idle_s)
    after = _threads_by_name()
    return {
        "names": sorted(after),
        "reader_wakes": [
            b - a
            for a, b in zip(
                before["tgpg-ring-read"], after["tgpg-ring-read"], strict=True
            )
        ],
    }


def test_an_idle_ranks_ring_readers_sleep_until_a_record_comes() -> None:
    # A reader that looked for a stop in slices of 50 ms would wake 20 times here.
    idle_s = 1.0
    for res in run_ranks(_idle_wakes, 3, idle_s):
        names, wakes = res.value["names"], res.value["reader_wakes"]
        # Named, so that top -H, gdb and py-spy say whose the threads are.
        assert {"tgpg-ops", "tgpg-ring-read", "tgpg-ring-write"} <= set(names), names
        assert len(wakes) == 2, (res.rank, wakes)  # one ring from each peer
        assert max(wakes) <= 2, (res.rank, wakes)


# --------------------------------------------------------------------------- attacks

RING_MAGIC = 0x31676E6972677074
PAGE = 4096
SLOTS = 8
SLOT_BYTES = 2 << 20
RECORDS, RECORD_BYTES = 16, 1024
PUBLISHED_AT = 52  # the header's count of records appended
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]
FUTEX_WAKE, INT_MAX = 1, 2**31 - 1
_LIBC = ctypes.CDLL(None, use_errno=True)
OP_POINT_TO_POINT, FLOAT32 = 11, 1
MESSAGE_NUMEL = 1000
SWITCH_NOT_MAPPED = "switched to a shared ring that this rank did not map"


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _records_offset(slots: int) -> int:
    return 64 + 64 * slots


def _data_offset(slots: int) -> int:
    return _round_up(_records_offset(slots) + RECORDS * RECORD_BYTES, PAGE)


def _file_bytes(slots: int, slot_bytes: int) -> int:
    return _data_offset(slots) + slots * _round_up(slot_bytes, PAGE)


class ForgedRing:
    """A ring made the way a rank makes one, but by hand: a sealed memfd with the header."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self.size = _file_bytes(SLOTS, SLOT_BYTES)
        os.ftruncate(self.fd, self.size)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        self.map = mmap.mmap(self.fd, self.size)
        self.token = os.urandom(32)
        self.map[0:8] = struct.pack("<Q", RING_MAGIC)
        self.map[8:40] = self.token

    def offer(self, fd: int | None = None) -> Any:
        import wire_client as wc

        return wc.pb.Frame(
            ring_offer=wc.pb.RingOffer(
                pid=os.getpid(),
                fd=self.fd if fd is None else fd,
                slots=SLOTS,
                slot_bytes=SLOT_BYTES,
                token=self.token,
            )
        )

    def attached(self) -> int:
        return int(struct.unpack_from("<I", self.map, 40)[0])

    def fill(self, index: int, seq: int, payload: bytes) -> None:
        start = _data_offset(SLOTS) + index * SLOT_BYTES
        self.map[start : start + len(payload)] = payload
        struct.pack_into("<Q", self.map, 64 * (index + 1) + 8, seq)
        struct.pack_into("<I", self.map, 64 * (index + 1), 1)

    def append(self, count: int, record: bytes, claimed: int | None = None) -> None:
        """Writes record number `count` (claiming `claimed` bytes), then publishes it."""
        start = _records_offset(SLOTS) + (count % RECORDS) * RECORD_BYTES
        length = len(record) if claimed is None else claimed
        struct.pack_into("<I", self.map, start, length)
        self.map[start + 4 : start + 4 + len(record)] = record
        self.publish(count + 1)

    def publish(self, published: int) -> None:
        """Moves the count of records appended on, and wakes the reader as a sender does.

        A rank wakes the reader only when its flag says it sleeps; this wakes it always,
        which needs no fence between the store and the look at the flag.
        """
        struct.pack_into("<I", self.map, PUBLISHED_AT, published)
        word = ctypes.c_uint32.from_buffer(self.map, PUBLISHED_AT)
        try:
            _LIBC.syscall(SYS_FUTEX, ctypes.byref(word), FUTEX_WAKE, INT_MAX, 0, 0, 0)
        finally:
            del word  # the mmap cannot close while the word points into it

    def wait_attached(self) -> int:
        for _ in range(1000):
            if self.attached():
                break
            time.sleep(0.01)
        return self.attached()

    def full(self, index: int) -> int:
        return int(struct.unpack_from("<I", self.map, 64 * (index + 1))[0])

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


def _message(seq: int, slot: tuple[int, int, int] | None, payload: bytes = b"") -> Any:
    """Point-to-point message `seq` of MESSAGE_NUMEL float32 from rank 1 to rank 0."""
    import wire_client as wc

    frame = wc.data_frame(seq, OP_POINT_TO_POINT, FLOAT32, MESSAGE_NUMEL, payload)
    if slot is not None:
        index, put, size = slot
        frame.header.ring_slot.CopyFrom(
            wc.pb.RingSlot(index=index, seq=put, bytes=size)
        )
    return frame


def _maps_of_this_process(name: str) -> bool:
    with open("/proc/self/maps") as maps:
        return any(f"/memfd:{name}" in line for line in maps)


def _mapped_count(name: str) -> int:
    """How many mappings of the memory file `name` this process has."""
    with open("/proc/self/maps") as maps:
        return sum(f"/memfd:{name}" in line for line in maps)


def _still_mapped_after(name: str, seconds: float) -> bool:
    """Whether the ring stays mapped: the server lets go of a refused stream's ring only
    once gRPC is done with the call, a moment after the caller has read its status."""
    deadline = time.monotonic() + seconds
    while _maps_of_this_process(name) and time.monotonic() < deadline:
        time.sleep(0.01)
    return _maps_of_this_process(name)


def _offer_and_switch(link: Any, ring: ForgedRing, offer: Any) -> dict[str, Any]:
    """Sends `offer`, switches to the ring, and appends a record whose payload it says
    is in slot 0; what came of it."""
    link.send_frame(offer)
    link.send_frame(_switch())
    ring.fill(0, 1, torch.zeros(MESSAGE_NUMEL).numpy().tobytes())
    ring.append(0, _message(1, (0, 1, MESSAGE_NUMEL * 4)).SerializeToString())
    code = link.status()[0].name
    return {"attached": ring.attached(), "code": code}


# What rank 1 plays, by case: the target rank 0 is dialled on, and what it sends. Each
# returns what it saw, for the parent to check.
def _attack_tcp(link: Any, ring: ForgedRing, *_: Any) -> dict[str, Any]:
    return _offer_and_switch(link, ring, ring.offer())


def _attack_own_ring_back(
    link: Any, ring: ForgedRing, _: Callable[[], None], store: Any
) -> dict[str, Any]:
    """Offers rank 0 a ring file of rank 0's own process: genuine-looking, sealed, of the
    right size, with the token it holds; only whose it is gives it away."""
    import wire_client as wc

    pid, fd, token = store.get("own-ring").decode().split()
    offer = wc.pb.Frame(
        ring_offer=wc.pb.RingOffer(
            pid=int(pid),
            fd=int(fd),
            slots=SLOTS,
            slot_bytes=SLOT_BYTES,
            token=bytes.fromhex(token),
        )
    )
    return _offer_and_switch(link, ring, offer)


def _attack_regular_file(link: Any, ring: ForgedRing, *_: Any) -> dict[str, Any]:
    # A file of exactly a ring's size, and a valid-looking header: only its kind is wrong.
    with tempfile.TemporaryFile() as regular:
        regular.truncate(ring.size)
        regular.write(bytes(ring.map[0:40]))
        regular.flush()
        return _offer_and_switch(link, ring, ring.offer(fd=regular.fileno()))


def _slot_named_on_the_stream(link: Any, ring: ForgedRing, *_: Any) -> dict[str, Any]:
    """A slot of a genuine, mapped ring, named on the stream instead of in a record."""
    link.send_frame(ring.offer())
    seen = {"attached": ring.wait_attached()}
    payload = torch.arange(MESSAGE_NUMEL, dtype=torch.float32).numpy().tobytes()
    ring.fill(0, 1, payload)
    link.send_frame(_message(1, (0, 1, len(payload))))
    seen["code"] = link.status()[0].name
    return seen


def _switch() -> Any:
    import wire_client as wc

    return wc.pb.Frame(ring_switch=wc.pb.RingSwitch())


def _switch_then(
    forge: Callable[[Any, ForgedRing], None],
) -> Callable[[Any, ForgedRing, Callable[[], None], Any], dict[str, Any]]:
    """Switches to a genuine ring, sends message 1 through a record that names a slot,
    then, once rank 0 has received it, does what `forge` does."""

    def attack(
        link: Any, ring: ForgedRing, wait_taken: Callable[[], None], _: Any
    ) -> dict[str, Any]:
        link.send_frame(ring.offer())
        seen = {"attached": ring.wait_attached()}
        link.send_frame(_switch())
        payload = torch.arange(MESSAGE_NUMEL, dtype=torch.float32).numpy().tobytes()
        ring.fill(0, 1, payload)
        ring.append(0, _message(1, (0, 1, len(payload))).SerializeToString())
        wait_taken()
        seen["slot_given_back"] = ring.full(0) == 0
        forge(link, ring)
        seen["code"] = link.status()[0].name
        return seen

    return attack


def _slot_out_of_range(_: Any, ring: ForgedRing) -> None:
    payload_bytes = MESSAGE_NUMEL * 4
    ring.append(1, _message(2, (SLOTS, 2, payload_bytes)).SerializeToString())


def _record_longer_than_a_record(_: Any, ring: ForgedRing) -> None:
    ring.append(1, _message(2, None).SerializeToString(), claimed=RECORD_BYTES * 4)


def _more_records_than_the_queue(_: Any, ring: ForgedRing) -> None:
    ring.publish(1 + 3 * RECORDS)


def _data_on_the_stream_after_the_switch(link: Any, _: ForgedRing) -> None:
    payload = torch.zeros(MESSAGE_NUMEL).numpy().tobytes()
    link.send_frame(_message(2, None, payload))


def _switch_without_a_ring(link: Any, ring: ForgedRing, *_: Any) -> dict[str, Any]:
    link.send_frame(_switch())
    return {"attached": ring.attached(), "code": link.status()[0].name}


# By case: whether rank 1 dials rank 0's unix socket, what it does, and how many
# receives rank 0 makes (one that succeeds, then one that fails; or one that fails).
ATTACKS: dict[str, tuple[bool, Callable[..., dict[str, Any]], int]] = {
    "offer-over-tcp": (False, _attack_tcp, 1),
    "offer-of-the-receivers-own-ring": (True, _attack_own_ring_back, 1),
    "offer-names-a-regular-file": (True, _attack_regular_file, 1),
    "slot-out-of-range": (True, _switch_then(_slot_out_of_range), 2),
    "record-longer-than-a-record": (
        True,
        _switch_then(_record_longer_than_a_record),
        2,
    ),
    "more-records-than-the-queue": (
        True,
        _switch_then(_more_records_than_the_queue),
        2,
    ),
    "data-on-the-stream-after-the-switch": (
        True,
        _switch_then(_data_on_the_stream_after_the_switch),
        2,
    ),
    "switch-without-a-ring": (True, _switch_without_a_ring, 1),
    "slot-named-on-the-stream": (True, _slot_named_on_the_stream, 1),
}


def _ring_attack(ctx: RankContext, case: str) -> dict[str, Any]:
    """Rank 0 of a group of two is real; rank 1 is played from Python (PythonRank), which
    holds rank 1's place and opens the group's point-to-point stream to rank 0 itself."""
    import wire_client as wc

    import torch_grpc_pg
    from torch_grpc_pg import _C

    over_unix, attack, receives = ATTACKS[case]
    init_groups(ctx)
    store = ctx.store()
    attacked = dist.PrefixStore("ring attack", store)
    report: dict[str, Any] = {}
    ring_name = f"forged-ring-{os.getpid()}"
    if ctx.rank == 1:
        ring = ForgedRing(ring_name)
        store.set("ring-name", ring_name)
        rank = wc.PythonRank(attacked, 1, 2, "ring-attack")
        rank.join()
        link = rank.open(0, p2p=True, unix=over_unix)

        def wait_taken() -> None:
            store.wait(["taken"], timedelta(seconds=60))

        report.update(attack(link, ring, wait_taken, store))
        link.close()
        ring.close()
        rank.leave()
        store.set("attack-done", "1")
    else:
        # A ring of rank 0's own, which the peer may try to offer back to it.
        own = ForgedRing(f"own-ring-{os.getpid()}")
        store.set("own-ring", f"{os.getpid()} {own.fd} {own.token.hex()}")
        pg = torch_grpc_pg.ProcessGroupGrpc(
            attacked,
            0,
            2,
            timedelta(seconds=30),
            "ring-attack",
            **torch_grpc_pg.Options().as_kwargs(_C.running_server_settings()),
        )
        name = store.get("ring-name").decode()
        received = torch.zeros(MESSAGE_NUMEL)
        outcomes: list[str] = []
        for _ in range(receives):
            try:
                pg.recv([received], 1, 0).wait()
                outcomes.append("received")
                report["data_exact"] = bool(
                    torch.equal(
                        received, torch.arange(MESSAGE_NUMEL, dtype=torch.float32)
                    )
                )
                report["mapped_while_used"] = _maps_of_this_process(name)
                store.set("taken", "1")
            except RuntimeError as e:
                outcomes.append(str(e))
        report["outcomes"] = outcomes
        store.wait(["attack-done"], timedelta(seconds=60))
        report["mapped_after"] = _still_mapped_after(name, 10.0)
        report["own_mapped_twice"] = _mapped_count(own.name) > 1
        own.close()
    # The attacked group is failed on rank 0; the default group must be unharmed.
    store_barrier(store, ctx.world_size, "attacked")
    total = torch.full((4,), float(ctx.rank + 1))
    dist.all_reduce(total)
    report["default_group_exact"] = bool(torch.equal(total, torch.full((4,), 3.0)))
    return report


@pytest.mark.parametrize(
    "case",
    ["offer-over-tcp", "offer-names-a-regular-file", "offer-of-the-receivers-own-ring"],
)
def test_a_refused_offer_is_not_mapped_and_its_slots_are_refused(case: str) -> None:
    results = run_ranks(_ring_attack, 2, case)
    attacker, rank0 = results[1].value, results[0].value
    assert attacker["attached"] == 0, attacker
    assert attacker["code"] == "INVALID_ARGUMENT", attacker
    (outcome,) = rank0["outcomes"]
    assert "rank 1" in outcome and SWITCH_NOT_MAPPED in outcome, outcome
    assert not rank0["mapped_after"] and not rank0["own_mapped_twice"], rank0
    assert all(r.value["default_group_exact"] for r in results)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("slot-out-of-range", "slot 8 of a ring of 8"),
        ("record-longer-than-a-record", "claims 4096 bytes, more than the 1020"),
        ("more-records-than-the-queue", "claims 48 unread records in a queue of 16"),
        ("data-on-the-stream-after-the-switch", "after switching to its shared ring"),
    ],
)
def test_a_genuine_ring_is_used_and_a_forged_reference_is_refused(
    case: str, expected: str
) -> None:
    results = run_ranks(_ring_attack, 2, case)
    attacker, rank0 = results[1].value, results[0].value
    # The positive control: a ring built by the protocol's description is taken, and a
    # record naming a slot in it is delivered exactly...
    assert attacker["attached"] == 1, attacker
    assert rank0["outcomes"][0] == "received", rank0
    assert rank0["data_exact"] and rank0["mapped_while_used"], rank0
    assert attacker["slot_given_back"], attacker
    # ...and the forged reference fails the next receive, naming the sender, and ends
    # its stream, which unmaps the ring.
    refused = rank0["outcomes"][1]
    assert "rank 1" in refused and expected in refused, refused
    assert attacker["code"] == "INVALID_ARGUMENT", attacker
    assert not rank0["mapped_after"], rank0
    assert all(r.value["default_group_exact"] for r in results)


@pytest.mark.parametrize(
    ("case", "mapped", "expected"),
    [
        ("switch-without-a-ring", 0, SWITCH_NOT_MAPPED),
        # The ring is genuine and mapped: only where the slot was named is wrong.
        (
            "slot-named-on-the-stream",
            1,
            "named a slot of its shared ring on its stream",
        ),
    ],
)
def test_a_ring_used_out_of_turn_is_refused(
    case: str, mapped: int, expected: str
) -> None:
    results = run_ranks(_ring_attack, 2, case)
    attacker, rank0 = results[1].value, results[0].value
    assert attacker["attached"] == mapped, attacker
    (outcome,) = rank0["outcomes"]
    assert "rank 1" in outcome and expected in outcome, outcome
    assert attacker["code"] == "INVALID_ARGUMENT", attacker
    assert not rank0["mapped_after"], rank0
    assert all(r.value["default_group_exact"] for r in results)


# --------------------------------------------------------------------------- out of threads

# The pids controller of cgroup v1, where this machine mounts it (root only).
PIDS_CGROUP = "/sys/fs/cgroup/pids"


def _out_of_threads(ctx: RankContext, cgroup: str) -> dict[str, Any]:
    """Rank 0 is put in a cgroup that lets it start no more threads (as a container's pids
    limit would), before its first frame arrives; rank 1 then sends it a chunk of an
    all-to-all, whose ring needs a reader thread on rank 0."""
    init_default_group(ctx)
    if ctx.rank == 0:
        os.makedirs(cgroup)
        with open(f"{cgroup}/cgroup.procs", "w") as procs:
            procs.write(str(os.getpid()))
        with open(f"{cgroup}/pids.current") as current:
            count = current.read().strip()
        with open(f"{cgroup}/pids.max", "w") as limit:
            limit.write(count)
    store_barrier(ctx.store(), ctx.world_size, "limited")

    def exchange() -> str | None:
        # Through the links, not the group's segment: rings carry an all-to-all.
        # Small chunks: what rank 0 sends fits the stream's flow-control window, so its
        # writes complete though rank 1, failed, no longer reads them.
        try:
            dist.all_to_all_single(
                torch.empty(256 * ctx.world_size), torch.ones(256 * ctx.world_size)
            )
        except RuntimeError as exc:
            return str(exc)
        return None

    # A writer sends inline until it sees its ring mapped, and an all-to-all at world
    # 2 is one frame per peer: the first may come inline, needing no reader. Once both
    # ranks are past it, rank 0 has read rank 1's offer (it came before the data) and
    # mapped the ring, so rank 1's next frame switches to it, and needs the reader.
    outcome = exchange()
    store_barrier(ctx.store(), ctx.world_size, "first exchange")
    if outcome is None:
        # Rank 1's frames of the second go into the ring, and it may finish before rank 0
        # fails; a third call meets the failure that rank 0's abort carried.
        outcome = exchange() or exchange() or "completed"
    if ctx.rank == 0:
        with open(f"{PIDS_CGROUP}/cgroup.procs", "w") as procs:
            procs.write(str(os.getpid()))  # back to the root cgroup, to be removed
        os.rmdir(cgroup)
    return {"outcome": outcome}


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(PIDS_CGROUP, os.W_OK),
    reason="needs root and cgroup v1's pids controller at " + PIDS_CGROUP,
)
def test_a_rank_that_cannot_start_a_ring_reader_fails_its_group_with_the_reason() -> (
    None
):
    cgroup = f"{PIDS_CGROUP}/torch-grpc-pg-test-{os.getpid()}"
    # The limit sits at the rank's count of threads, but gRPC ends idle threads on
    # its own time, and one that ends frees a slot the reader's thread may take:
    # then the op completes, rightly, and the case is tried again. (A lower limit
    # starves gRPC's own threads, and the rank cannot even exit.)
    tries = []
    for _ in range(5):
        outcomes = [
            res.value["outcome"] for res in run_ranks(_out_of_threads, 2, cgroup)
        ]
        tries.append(outcomes)
        if outcomes != ["completed", "completed"]:
            break
    # Rank 0's process lives on to raise; each rank names the thread it could not start.
    for rank, outcome in enumerate(tries[-1]):
        assert (
            "could not start the thread that reads rank 1's shared ring" in outcome
        ), (rank, tries)
