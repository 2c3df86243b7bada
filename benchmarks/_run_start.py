"""What both benchmark scripts do before measuring: record the machine, choose the backends."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from _args import default_backends, reference_backend
from _backends import available_backends
from _report import OtherLoad, busy_note, machine_info


@dataclass
class RunStart:
    machine: dict[str, Any]
    other_load: OtherLoad
    reference: str
    backends: list[str]
    notes: list[str]


def start_run(args: argparse.Namespace) -> RunStart | None:
    """None, having said why on stderr, when no requested backend can run."""
    # Taken before the run, so that it tells whether other work was using the CPUs.
    machine = machine_info()
    if busy := busy_note(machine["cpu_busy_percent"]):
        print(f"note: {busy}", file=sys.stderr)
    other_load = OtherLoad()
    requested = args.backends or default_backends(args.device)
    backends, notes = available_backends(requested, args.device)
    if not backends:
        print("\n".join([*notes, "no backend left to run"]), file=sys.stderr)
        return None
    return RunStart(
        machine, other_load, reference_backend(args.device), backends, notes
    )
