#!/usr/bin/env python3
"""Turns Google Benchmark JSON from bench_linear / bench_decode into the ratio tables of
bench/README.md: each dissect kernel against the baselines measured in the same run.

  bench/report.py linear.json decode.json [blas.json]

Medians of repetitions are used when the run has them (--benchmark_repetitions=N), else the
single measurement. Only the standard library is needed.
"""
import json
import re
import sys
from collections import defaultdict

NAME = re.compile(r"^(?P<op>\w+)/(?P<impl>[\w]+)/(?P<shape>\d+x\d+)/M=(?P<m>\d+)/threads=(?P<t>\d+)")


def load(paths):
    """{(op, impl, shape, m, threads): {"gflops": .., "wbytes": ..}} from one or more files."""
    rows = {}
    for path in paths:
        with open(path) as handle:
            data = json.load(handle)
        has_median = any(b.get("aggregate_name") == "median" for b in data["benchmarks"])
        for bench in data["benchmarks"]:
            if has_median and bench.get("aggregate_name") != "median":
                continue
            match = NAME.match(bench["name"])
            if not match:
                continue
            key = (match["op"], match["impl"], match["shape"], int(match["m"]), int(match["t"]))
            rows[key] = {"gflops": bench.get("GFLOP/s", 0) / 1e9,
                         "wbytes": bench.get("weights B/s", 0) / 1e9}
    return rows


def ratio(a, b):
    return a / b if b else float("nan")


def verdict(value, target):
    return "met" if value >= target else "**not met**"


def main(paths):
    rows = load(paths)
    lines = []
    # 1. The abstraction costs nothing: dissect vs the bare Eigen expression, 1 thread.
    lines.append("| op | shape | M | dissect GFLOP/s | bare Eigen GFLOP/s | ratio (target ≥ 0.97) | cblas GFLOP/s |")
    lines.append("|---|---|---|---|---|---|---|")
    worst = defaultdict(lambda: float("inf"))
    for (op, impl, shape, m, t), row in sorted(rows.items(), key=lambda kv: (kv[0][0] != "forward", kv[0][2], kv[0][3])):
        if impl != "dissect" or t != 1 or op == "decode":
            continue
        eigen = rows.get((op, "baseline_eigen_expr", shape, m, t))
        if not eigen:
            continue
        cblas = (rows.get((op, "baseline_cblas_sgemm", shape, m, t)) or rows.get((op, "baseline_cblas_sgemv", shape, m, t)))
        r = ratio(row["gflops"], eigen["gflops"])
        worst[op] = min(worst[op], r)
        lines.append(f"| {op} | {shape} | {m} | {row['gflops']:.1f} | {eigen['gflops']:.1f} | {r:.2f} | "
                     f"{cblas['gflops']:.1f} |" if cblas else f"| {op} | {shape} | {m} | {row['gflops']:.1f} | "
                     f"{eigen['gflops']:.1f} | {r:.2f} | – |")
    lines.append("")
    for op, r in worst.items():
        lines.append(f"- worst {op} ratio vs bare Eigen: {r:.2f} ({verdict(r, 0.97)})")

    # 2. No cliff: 4096→11008 vs the library's own 4096→4096 at M = 128, 1 thread.
    wide = rows.get(("forward", "dissect", "4096x11008", 128, 1))
    square = rows.get(("forward", "dissect", "4096x4096", 128, 1))
    if wide and square:
        r = ratio(wide["gflops"], square["gflops"])
        eigen_wide = rows.get(("forward", "baseline_eigen_expr", "4096x11008", 128, 1))
        extra = f"; bare Eigen at 4096x11008: {eigen_wide['gflops']:.1f} GFLOP/s" if eigen_wide else ""
        lines.append(f"- 4096x11008 vs 4096x4096 at M = 128, 1 thread: {wide['gflops']:.1f} / "
                     f"{square['gflops']:.1f} = {r:.2f} (target ≥ 0.9, {verdict(r, 0.9)}){extra}")

    # 3, 4. Threads: decode (M = 1, weights from DRAM) and M = 8, 2 threads vs 1.
    for (op, impl, shape, m, t), row in sorted(rows.items()):
        if impl != "dissect" or t == 1:
            continue
        one = rows.get((op, impl, shape, m, 1))
        if not one:
            continue
        if op == "decode":
            r = ratio(row["wbytes"], one["wbytes"])
            target = 1.6 if m == 1 else 1.0
            lines.append(f"- decode {shape} M = {m}, {t} threads vs 1: {row['wbytes']:.1f} / {one['wbytes']:.1f} "
                         f"GB/s = {r:.2f} (target ≥ {target}, {verdict(r, target)})")
        elif m == 8:
            r = ratio(row["gflops"], one["gflops"])
            lines.append(f"- {op} {shape} M = 8, {t} threads vs 1: {r:.2f} (target ≥ 1.0, {verdict(r, 1.0)})")

    # 5. BLAS build: dissect (Eigen → BLAS) vs cblas_sgemm directly, M ≥ 128.
    for (op, impl, shape, m, t), row in sorted(rows.items()):
        if impl != "dissect" or m < 128 or op == "decode":
            continue
        cblas = rows.get((op, "baseline_cblas_sgemm", shape, m, t))
        if cblas:
            r = ratio(row["gflops"], cblas["gflops"])
            lines.append(f"- vs cblas_sgemm: {op} {shape} M = {m} threads = {t}: {r:.2f}")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
