#!/usr/bin/env python3
"""Per-kernel achieved bandwidth from an Nsight Compute CSV (the table issue 33 asks for).

Reads the output of

    ncu --clock-control none --csv --metrics \\
        gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        [--launch-skip N --launch-count M] python3 benchmarks/bench_hybrid.py ...

(lines that are not CSV rows, such as the program's own output, are skipped) and prints, per
kernel name: launches, mean time, mean DRAM bytes read and written, achieved GB/s (bytes read
plus written over time, summed over launches) and, with --copy-gbs (the device-to-device copy
bandwidth lease.sh measures, read plus write), its share of that ceiling. ncu replays each launch
with the caches flushed, so small kernels read from DRAM what a real run finds in L2: their
figures are a floor on their speed, not the decode step's.

    python benchmarks/gpu/ncu_table.py ncu.csv --copy-gbs 4250 [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")
#: ncu's units, to seconds and bytes.
SCALE = {"ns": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3, "nsecond": 1e-9}
SCALE |= {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def read_launches(lines) -> dict[str, dict[str, float]]:
    """{launch id: {"name": kernel, metric: value in seconds or bytes}} from ncu's CSV rows."""
    rows = list(csv.reader(line for line in lines if line.startswith('"')))
    if not rows:
        raise SystemExit("no CSV rows: is this ncu --csv output?")
    head = {h: i for i, h in enumerate(rows[0])}
    need = ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
    missing = [h for h in need if h not in head]
    if missing:
        raise SystemExit(f"ncu CSV without the columns {missing}")
    launches: dict[str, dict] = {}
    for r in rows[1:]:
        metric = r[head["Metric Name"]]
        if metric not in METRICS:
            continue
        unit = r[head["Metric Unit"]]
        if unit not in SCALE:
            raise SystemExit(f"unknown unit {unit!r} of {metric}")
        value = float(r[head["Metric Value"]].replace(",", "")) * SCALE[unit]
        launch = launches.setdefault(r[head["ID"]], {"name": r[head["Kernel Name"]]})
        launch[metric] = value
    return launches


def table(launches: dict[str, dict], copy_gbs: float | None) -> list[dict]:
    """Per kernel: launches, mean µs, mean MB read and written, GB/s, share of the copy rate."""
    per: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for launch in launches.values():
        if not all(m in launch for m in METRICS):
            continue
        a = per[launch["name"]]
        a[0] += 1
        a[1] += launch[METRICS[0]]
        a[2] += launch[METRICS[1]]
        a[3] += launch[METRICS[2]]
    out = []
    for name, (n, t, rd, wr) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        gbs = (rd + wr) / t / 1e9 if t > 0 else 0.0
        out.append(
            {
                "kernel": name,
                "launches": n,
                "us": t / n * 1e6,
                "read_mb": rd / n / 1e6,
                "write_mb": wr / n / 1e6,
                "gbs": gbs,
                "share": gbs / copy_gbs if copy_gbs else None,
                "total_us": t * 1e6,
            }
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("csv", help="ncu --csv output (a file, or - for stdin)")
    ap.add_argument("--copy-gbs", type=float, help="device copy bandwidth, GB/s (read + write)")
    ap.add_argument("--json", help="write the table here too")
    args = ap.parse_args(argv)
    src = sys.stdin if args.csv == "-" else open(args.csv, encoding="utf-8", errors="replace")
    with src:
        rows = table(read_launches(src), args.copy_gbs)
    total = sum(r["total_us"] for r in rows)
    print(
        f"{'kernel':<28} {'launches':>8} {'us each':>9} {'MB read':>9} {'GB/s':>8} {'of copy':>8}"
    )
    for r in rows:
        share = "-" if r["share"] is None else f"{r['share']:.0%}"
        print(
            f"{r['kernel']:<28} {r['launches']:>8} {r['us']:>9.2f} {r['read_mb']:>9.3f} "
            f"{r['gbs']:>8.0f} {share:>8}"
        )
    print(f"{'total':<28} {sum(r['launches'] for r in rows):>8} {total:>9.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_gbs": args.copy_gbs, "kernels": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
