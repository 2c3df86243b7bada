"""The project's performance targets, checked on one run's rows (see RESULTS.md)."""

from __future__ import annotations

from collections.abc import Sequence

from _report import Row

MiB = 2**20
RSS_SLACK = 64 * MiB


HALF_DTYPES = ("bfloat16", "float16")


def find_row(rows: Sequence[Row], **key: object) -> Row | None:
    """The first successful row whose fields equal ``key``."""
    for row in rows:
        if row.get("status") == "ok" and all(row.get(k) == v for k, v in key.items()):
            return row
    return None


def allreduce_64mib(rows: Sequence[Row], backend: str, dtype: str) -> Row | None:
    """The world-2 64 MiB allreduce row that the half-precision targets compare."""
    return find_row(
        rows, backend=backend, op="allreduce", dtype=dtype, bytes=64 * MiB, world=2
    )


def _target(
    name: str, value: float | None, goal: str, passed: bool | None, unit: str = "x"
) -> Row:
    return {
        "target": name,
        # Three decimals so that a FAIL at 1.052x does not print as 1.05x.
        "value": None if value is None else f"{value:.3f}{unit}",
        "goal": goal,
        "result": "n/a" if passed is None else ("PASS" if passed else "FAIL"),
    }


def _ratio(
    rows: Sequence[Row], metric: str, candidate: str, ref: str, **key: object
) -> float | None:
    cand = find_row(rows, backend=candidate, **key)
    base = find_row(rows, backend=ref, **key)
    if cand is None or base is None or not base.get(metric):
        return None
    return float(cand[metric]) / float(base[metric])


def collective_targets(
    rows: Sequence[Row], rss_rows: Sequence[Row], candidate: str, ref: str
) -> list[Row]:
    out: list[Row] = []
    bw_cases = [
        ("allreduce", 64 * MiB, 2),
        ("allreduce", 64 * MiB, 4),
        ("allreduce", 1 * MiB, 2),
        ("broadcast", 16 * MiB, 2),
        ("allgather", 16 * MiB, 2),
    ]
    for op, nbytes, world in bw_cases:
        value = _ratio(
            rows,
            "busbw_gbps",
            candidate,
            ref,
            op=op,
            dtype="float32",
            bytes=nbytes,
            world=world,
        )
        name = f"{op} f32 {nbytes // MiB} MiB w{world} busbw {candidate}/{ref}"
        out.append(
            _target(name, value, ">= 1.00x", None if value is None else value >= 1.0)
        )
    value = _ratio(
        rows,
        "lat_us",
        candidate,
        ref,
        op="allreduce",
        dtype="float32",
        bytes=4,
        world=2,
    )
    name = f"allreduce f32 4 B w2 latency {candidate}/{ref}"
    out.append(
        _target(name, value, "<= 1.00x", None if value is None else value <= 1.0)
    )
    f32 = allreduce_64mib(rows, candidate, "float32")
    for dtype in HALF_DTYPES:
        half = allreduce_64mib(rows, candidate, dtype)
        value = None if f32 is None or half is None else half["lat_us"] / f32["lat_us"]
        name = f"allreduce {dtype} 64 MiB w2 time / float32 time ({candidate})"
        out.append(
            _target(name, value, "<= 1.20x", None if value is None else value <= 1.2)
        )
    for row in rss_rows:
        limit = row["bytes"] + RSS_SLACK
        value = row.get("peak_over_base_mib")
        size = f"{row['bytes'] // MiB} MiB w{row['world']}"
        name = f"peak RSS over baseline, allreduce {size} ({row['backend']})"
        passed = None if value is None else value * MiB <= limit
        out.append(_target(name, value, f"<= {limit // MiB} MiB", passed, unit=" MiB"))
    return out


def ddp_targets(rows: Sequence[Row], candidate: str, ref: str) -> list[Row]:
    out: list[Row] = []
    for model in dict.fromkeys(row["model"] for row in rows):
        worlds = dict.fromkeys(row["world"] for row in rows if row["model"] == model)
        for world in worlds:
            value = _ratio(rows, "step_ms", candidate, ref, model=model, world=world)
            name = f"DDP step time {model} w{world} {candidate}/{ref}"
            out.append(
                _target(
                    name, value, "<= 1.05x", None if value is None else value <= 1.05
                )
            )
    return out
