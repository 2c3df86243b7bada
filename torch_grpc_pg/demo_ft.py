"""Lose a replica, keep training: three replica groups train with DDP under torchft; one is
killed mid-run and restarted, heals from a live replica, and training goes on.

    python -m torch_grpc_pg.demo --fault-tolerant [--backends grpc,gloo] [--steps 40]

For each backend a torchft lighthouse is started here and three replica groups (one rank
each) in processes of their own, whose torchft Manager runs its allreduces over that
backend's torchft process group (torch_grpc_pg.torchft.ProcessGroupGrpc, or torchft's
ProcessGroupGloo). Replica 0's steps are printed as they commit, with the loss and how
many replicas took part; replica 2 is killed with SIGKILL at --kill-at and started again
--restart-after seconds later. The summary gives, per backend and as grpc/gloo in the
same run: the time from the kill to the next committed step, and the time of a
reconfiguration, from configure() to the end of the first allreduce on the new group.
Needs torchft (pip install 'torch-grpc-pg[torchft]').
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

EVENT_TAG = "FT_EVENT "
REPLICAS = 3
VICTIM = 2  # the replica that is killed; replica 0 is the one whose steps are printed
# The lighthouse drops a replica that has not sent a heartbeat for this long; torchft's
# Manager sends one every 100 ms. Below torchft's 5 s default so the demo stays short;
# it bounds the time from a kill to the next commit for every backend alike.
HEARTBEAT_TIMEOUT_MS = 1000
# A new quorum waits this long for replicas that are not there yet.
JOIN_TIMEOUT_MS = 500


# ---------------------------------------------------------------- replica (one process)


def _emit(**event: Any) -> None:
    print(EVENT_TAG + json.dumps(event), flush=True)


def _timed(base: type) -> type:
    """``base`` that reports how long each configure() takes, and how long from its start
    to the end of the first allreduce on the new group."""

    class Timed(base):  # type: ignore[valid-type,misc]
        _since: float | None = None

        def configure(self, *args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            super().configure(*args, **kwargs)
            self._since = start
            _emit(kind="configure", seconds=time.perf_counter() - start)

        def allreduce(self, tensors: Any, opts: Any) -> Any:
            work = super().allreduce(tensors, opts)
            since, self._since = self._since, None
            if since is not None:

                def done(_: Any) -> None:
                    _emit(kind="first_allreduce", seconds=time.perf_counter() - since)

                work.get_future().add_done_callback(done)
            return work

    return Timed


def _stop_step(stop_file: str) -> int | None:
    try:
        with open(stop_file) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def replica(replica_id: int, backend: str, lighthouse: str, stop_file: str) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel

    if backend == "grpc":
        from torch_grpc_pg.torchft import ProcessGroupGrpc as Group
    else:
        from torchft.process_group import ProcessGroupGloo as Group

    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same initial model everywhere; a restart heals anyway
    teacher = nn.Linear(16, 1)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        _emit(
            kind="healed",
            replica=replica_id,
            step=manager.current_step(),
            t=time.time(),
        )

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=_timed(Group)(timeout=timedelta(seconds=10)),
        min_replica_size=2,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"replica{replica_id}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        use_async_quorum=False,
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=30),
    )
    ddp = DistributedDataParallel(manager, model)
    stop: int | None = None
    try:
        while True:
            step = manager.current_step()
            # Every replica stops at the same step, which the launcher names a few steps
            # ahead: one that left early would fail the others' step.
            stop = stop if stop is not None else _stop_step(stop_file)
            if stop is not None and step >= stop:
                break
            # Each replica its own shard of each step's data, whatever happened before.
            data = torch.Generator().manual_seed(step * REPLICAS + replica_id)
            x = torch.randn(64, 16, generator=data)
            y = torch.sin(3 * teacher(x)).detach()
            manager.start_quorum()
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()  # torchft's DDP allreduces the gradients over the quorum
            committed = manager.should_commit()
            if committed:
                optimizer.step()
            _emit(
                kind="step",
                replica=replica_id,
                step=step,
                committed=committed,
                loss=loss.item(),
                participants=manager.num_participants(),
                t=time.time(),
            )
            time.sleep(0.05)  # a visible pace; a kill lands mid-run
    finally:
        manager.shutdown(wait=False)
    return 0


# ---------------------------------------------------------------- launcher


@dataclass
class Run:
    backend: str
    kill_time: float | None = None
    kill_to_commit: float | None = None
    restart_time: float | None = None
    healed_at: int | None = None
    configures: list[float] = field(default_factory=list)
    first_allreduces: list[float] = field(default_factory=list)
    final_loss: float | None = None
    ok: bool = False


def _start(replica_id: int, backend: str, lighthouse: str, stop_file: str, events: Any):
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [
        sys.executable,
        "-m",
        "torch_grpc_pg.demo_ft",
        "--replica",
        str(replica_id),
        "--backend",
        backend,
        "--lighthouse",
        lighthouse,
        "--stop-file",
        stop_file,
    ]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(EVENT_TAG):
                events.put((replica_id, json.loads(line[len(EVENT_TAG) :])))
            elif os.environ.get("TORCH_GRPC_PG_DEMO_VERBOSE"):
                print(f"    replica {replica_id}: {line}", end="")
        events.put((replica_id, {"kind": "exit", "proc": proc}))

    threading.Thread(target=pump, daemon=True).start()
    return proc


def serve_lighthouse() -> int:
    """A torchft lighthouse in a process of its own, whose log (a line per quorum) goes
    nowhere; prints its address and serves until its stdin closes."""
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(
        bind="[::]:0",
        min_replicas=2,
        join_timeout_ms=JOIN_TIMEOUT_MS,
        heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
    )
    print(lighthouse.address(), flush=True)
    sys.stdin.read()
    lighthouse.shutdown()
    return 0


def _start_lighthouse() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch_grpc_pg.demo_ft", "--serve-lighthouse"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    address = proc.stdout.readline().strip()
    if not address:
        raise RuntimeError("the torchft lighthouse did not start")
    return proc, address


def run_backend(
    backend: str,
    steps: int,
    kill_at: int,
    restart_after: float,
    steps_after_heal: int,
    timeout: float,
    work_dir: str,
) -> Run:
    run = Run(backend)
    lighthouse_proc, lighthouse = _start_lighthouse()
    stop_file = os.path.join(work_dir, f"stop-{backend}")
    events: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
    procs = {
        r: _start(r, backend, lighthouse, stop_file, events) for r in range(REPLICAS)
    }
    restart_at: float | None = None
    # Replica 0's commits with every replica taking part, after the heal.
    whole_again = 0
    deadline = time.monotonic() + timeout
    finished: set[int] = set()
    try:
        while len(finished) < REPLICAS and time.monotonic() < deadline:
            if restart_at is not None and time.monotonic() >= restart_at:
                restart_at = None
                run.restart_time = time.time()
                print(f"  -- replica {VICTIM} restarted", flush=True)
                procs[VICTIM] = _start(VICTIM, backend, lighthouse, stop_file, events)
            try:
                source, event = events.get(timeout=0.1)
            except queue.Empty:
                continue
            kind = event["kind"]
            if kind == "exit":
                if event["proc"] is procs[source]:
                    code = event["proc"].wait()
                    if code == 0:
                        finished.add(source)
                    elif source != VICTIM or run.kill_time is None or code != -9:
                        print(f"  replica {source} exited with code {code}")
                        return run
                continue
            if kind == "healed":
                # A replica that starts late heals too; the run waits for the victim's.
                after = ""
                if source == VICTIM and run.restart_time is not None:
                    run.healed_at = event["step"]
                    after = f", {event['t'] - run.restart_time:.1f} s after its restart"
                print(
                    f"  -- replica {event['replica']} healed from a live replica "
                    f"at step {event['step']}{after}",
                    flush=True,
                )
            elif source == 0 and kind == "configure":
                run.configures.append(event["seconds"])
            elif source == 0 and kind == "first_allreduce":
                run.first_allreduces.append(event["seconds"])
            elif source == 0 and kind == "step":
                _print_step(run, event)
                if not event["committed"]:
                    continue
                run.final_loss = event["loss"]
                if (
                    run.kill_time is None
                    and event["step"] + 1 >= kill_at
                    and event["participants"] == REPLICAS
                ):
                    procs[VICTIM].send_signal(signal.SIGKILL)
                    run.kill_time = time.time()
                    restart_at = time.monotonic() + restart_after
                    print(f"  -- replica {VICTIM} killed (SIGKILL)", flush=True)
                elif run.kill_time and run.kill_to_commit is None:
                    run.kill_to_commit = event["t"] - run.kill_time
                if run.healed_at is not None and event["participants"] == REPLICAS:
                    whole_again += 1
                    if whole_again == steps_after_heal:
                        # A few steps ahead, so that every replica reads it in time.
                        stop = max(steps, event["step"] + 4)
                        with open(stop_file, "w") as f:
                            f.write(str(stop))
        run.ok = len(finished) == REPLICAS
        if not run.ok:
            print(f"  timed out after {timeout:.0f} s")
        return run
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lighthouse_proc.communicate(timeout=10)


def _print_step(run: Run, event: dict[str, Any]) -> None:
    status = "committed" if event["committed"] else "not committed (a peer failed)"
    since = ""
    if run.kill_time is not None and run.kill_to_commit is None and event["committed"]:
        since = f"  {event['t'] - run.kill_time:.2f} s after the kill"
    print(
        f"  [{run.backend}] step {event['step']:3d}  loss {event['loss']:.4f}  "
        f"replicas {event['participants']}  {status}{since}",
        flush=True,
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summary(runs: dict[str, Run]) -> None:
    print(
        "\nbackend  kill -> next commit  configure (median)  configure -> first allreduce"
    )
    for backend, run in runs.items():
        if not run.ok:
            print(f"{backend:<8} failed")
            continue
        print(
            f"{backend:<8} {_s(run.kill_to_commit):>19}  {_s(_median(run.configures)):>18}"
            f"  {_s(_median(run.first_allreduces)):>28}"
            f"   ({len(run.configures)} reconfigurations)"
        )
    grpc, gloo = runs.get("grpc"), runs.get("gloo")
    if grpc and gloo and grpc.ok and gloo.ok:
        for label, ours, theirs in (
            ("kill -> next commit", grpc.kill_to_commit, gloo.kill_to_commit),
            (
                "configure -> first allreduce",
                _median(grpc.first_allreduces),
                _median(gloo.first_allreduces),
            ),
        ):
            if ours and theirs:
                print(f"grpc/gloo {label}: {ours / theirs:.2f}x")


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="grpc,gloo")
    parser.add_argument("--steps", type=int, default=40, help="at least this many")
    parser.add_argument("--kill-at", type=int, default=15, help="step of the kill")
    parser.add_argument("--restart-after", type=float, default=1.0, help="seconds")
    parser.add_argument("--timeout", type=float, default=180.0, help="per backend, s")
    parser.add_argument(
        "--steps-after-heal",
        type=int,
        default=10,
        help="steps of all replicas after the heal, before the run ends",
    )
    parser.add_argument("--replica", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", help=argparse.SUPPRESS)
    parser.add_argument(
        "--serve-lighthouse", action="store_true", help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.serve_lighthouse:
        return serve_lighthouse()
    if args.replica is not None:
        return replica(args.replica, args.backend, args.lighthouse, args.stop_file)

    try:
        import torchft  # noqa: F401
    except ImportError:
        print(
            "the fault-tolerant demo needs torchft: pip install 'torch-grpc-pg[torchft]'"
        )
        return 1
    runs: dict[str, Run] = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        print(
            f"== {backend}: {REPLICAS} replica groups under torchft, {args.steps} steps; "
            f"replica {VICTIM} is killed at step {args.kill_at}",
            flush=True,
        )
        with tempfile.TemporaryDirectory(prefix="torch-grpc-pg-demo-ft-") as work_dir:
            runs[backend] = run_backend(
                backend,
                args.steps,
                args.kill_at,
                args.restart_after,
                args.steps_after_heal,
                args.timeout,
                work_dir,
            )
    summary(runs)
    return 0 if all(r.ok and r.kill_to_commit for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
