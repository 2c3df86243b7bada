"""A relay planted in the store, between two ranks that hold the same token.

The attacker can write to the c10d store, so rank 0 finds the relay (tests/relay.py) where
rank 1's address should be. The relay forwards the handshake both ways unchanged, so both
ranks prove the token to each other through it and the group forms. Then it flips a bit of,
drops, or replays the first frame that carries data. The keys that each link derives from its
handshake make every such frame fail on arrival: the group fails on every rank, naming the
link, and no rank returns a wrong result.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dist_harness import RankContext, backend_under_test, run_ranks, store_barrier

pytestmark = pytest.mark.skipif(
    backend_under_test() != "grpc", reason="attacks on the grpc backend's links"
)

TOKEN = "the-real-token"
NUMEL = 1000
ROUNDS = 3


def _relayed_allreduces(
    ctx: RankContext, tamper_name: str, encrypt: bool
) -> dict[str, object]:
    import relay
    import wire_client as wc

    import torch_grpc_pg

    store: dist.Store = dist.PrefixStore("relayed", ctx.store())
    rank1_port = ctx.spare_ports[0]
    planted = None
    if ctx.rank == 0:
        planted = relay.Relay.for_attack(tamper_name, f"127.0.0.1:{rank1_port}")
        relay_port = planted.start()
        # Rank 0 reads the relay's address where rank 1's belongs.
        store = wc.StoreWithPlantedEndpoint(
            store, 1, f"v1\nelsewhere\n127.0.0.1:{relay_port}\n"
        )
    options = torch_grpc_pg.Options(
        auth_token=TOKEN,
        encrypt=encrypt,
        bind_host="127.0.0.1",
        advertise_host="127.0.0.1",
        unix_sockets=False,
        port=rank1_port if ctx.rank == 1 else 0,
    )
    pg = torch_grpc_pg.ProcessGroupGrpc(
        store, ctx.rank, 2, timedelta(seconds=30), "relayed", **options.as_kwargs()
    )
    results: list[str] = []
    started = time.monotonic()
    for _ in range(ROUNDS):
        tensor = torch.full((NUMEL,), float(ctx.rank + 1))
        try:
            pg.allreduce([tensor]).wait()
        except RuntimeError as error:
            results.append("error: " + str(error))
            break
        results.append(
            "exact" if torch.equal(tensor, torch.full((NUMEL,), 3.0)) else "wrong"
        )
    report: dict[str, object] = {
        "results": results,
        "seconds": time.monotonic() - started,
    }
    if planted is not None:
        report["tampered"] = planted.tampered
        report["calls"] = planted.calls
    store_barrier(ctx.store(), 2, "reported")
    if planted is not None:
        planted.stop()
    return report


@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypted", "authenticated"])
@pytest.mark.parametrize("tamper_name", ["flip_last_byte", "drop", "replay"])
def test_a_relay_that_tampers_with_frames_fails_the_group_on_every_rank(
    tamper_name: str, encrypt: bool
) -> None:
    reports = [
        r.value
        for r in run_ranks(
            _relayed_allreduces, 2, tamper_name, encrypt, spare_ports=1, timeout_s=120
        )
    ]
    assert reports[0]["calls"] >= 1 and reports[0]["tampered"] == 1, reports
    for rank, report in enumerate(reports):
        results = report["results"]
        assert "wrong" not in results, f"rank {rank} returned a wrong result: {report}"
        # A dropped frame is noticed when the next one arrives; by then rank 0 has
        # completed the allreduce whose frame was dropped, with its own exact result.
        assert results[-1].startswith("error: "), f"rank {rank} never failed: {report}"
        error = results[-1]
        assert "from rank 0 to rank 1" in error, error
        assert "failed authentication" in error, error
        assert "timed out" not in error, error
        assert report["seconds"] < 20, report
