#!/usr/bin/env python3
"""Old against new: the same benchmark binary built from two trees, timed in one session.

    bench/compare_builds.py OLD_BINARY NEW_BINARY [--filter REGEX] [--rounds N] [--repetitions N]

Runs OLD, NEW, OLD, NEW, ... (--rounds pairs, interleaved so that a slow spell of the machine
hits both), each with --benchmark_repetitions, and prints one row per benchmark: the median real time of each build over all its repetitions, and old/new (≥ 1: the new
build is at least as fast), and old/old: the first round of the old build against its last, the
noise floor an identical binary shows on this machine in the same session. The last line names
the smallest ratio. Exits 1 if a benchmark ran in
one build only (a renamed case would otherwise drop out of the comparison unseen).

--per-case interleaves at the finest grain instead: for each benchmark in turn, its rounds run
old, new, new, old, old, new, ... (ABBA, so that a drift within the case's own seconds falls on
both builds alike), each a process of its own with that one case. A whole-binary round takes
minutes, and on a shared VM a slow spell of that length lands on one build's round; per case,
both builds of a cell are timed within seconds of each other.
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(binary, flt, repetitions, min_time):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    subprocess.run([binary, f"--benchmark_filter={flt}", f"--benchmark_repetitions={repetitions}",
                    f"--benchmark_min_time={min_time}", "--benchmark_format=json",
                    f"--benchmark_out={path}", "--benchmark_out_format=json"],
                   check=True, stdout=subprocess.DEVNULL)
    data = json.loads(Path(path).read_text())
    Path(path).unlink()
    times = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "iteration":
            times.setdefault(b["run_name"], []).append(b["real_time"])
    return times


def list_cases(binary, flt):
    """The names of the benchmarks `binary` runs under `flt`, as --benchmark_list_tests gives them."""
    out = subprocess.run([binary, f"--benchmark_filter={flt}", "--benchmark_list_tests=true"],
                         check=True, capture_output=True, text=True).stdout
    # The programs print their context (threads, flags, peaks) before the list: names are the
    # unindented lines with a '/' that the filter selects.
    return [line for line in out.splitlines()
            if line and not line[0].isspace() and "/" in line and re.search(flt, line)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--filter", default=".")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--min-time", default="0.1")
    parser.add_argument("--per-case", action="store_true",
                        help="interleave the two builds case by case (ABBA), not whole binaries")
    args = parser.parse_args()

    old, new, old_rounds = {}, {}, []
    if args.per_case:
        names = list_cases(args.old, args.filter)
        old_rounds = [{}, {}]  # the first and the last round of the old build, per case
        for name in names:
            case = "^" + re.escape(name) + "$"
            for r in range(args.rounds):
                order = ((args.old, old), (args.new, new))
                for binary, into in (order if r % 2 == 0 else order[::-1]):
                    times = run(binary, case, args.repetitions, args.min_time)
                    for got, t in times.items():
                        into.setdefault(got, []).extend(t)
                        if binary is args.old and r in (0, args.rounds - 1):
                            old_rounds[0 if r == 0 else 1][got] = t
        for name in set(list_cases(args.new, args.filter)) - set(names):
            new[name] = []  # in the new build only: reported below
    else:
        for _ in range(args.rounds):
            for binary, into in ((args.old, old), (args.new, new)):
                times = run(binary, args.filter, args.repetitions, args.min_time)
                for name, t in times.items():
                    into.setdefault(name, []).extend(t)
                if binary is args.old:
                    old_rounds.append(times)
    missing = sorted(set(old) ^ set(new))
    print("| benchmark | old (median) | new (median) | old/new | old/old |")
    print("|---|---|---|---|---|")
    ratios = []
    for name in sorted(set(old) & set(new)):
        o, n = statistics.median(old[name]), statistics.median(new[name])
        ratios.append((o / n, name))
        first, last = old_rounds[0].get(name), old_rounds[-1].get(name)
        floor = statistics.median(first) / statistics.median(last) if first and last else float("nan")
        print(f"| {name} | {o:.4g} | {n:.4g} | {o / n:.3f} | {floor:.3f} |")
    if ratios:
        worst = min(ratios)
        print(f"\n{len(ratios)} cells, median ratio {statistics.median(r for r, _ in ratios):.3f}, "
              f"smallest {worst[0]:.3f} ({worst[1]})")
    if missing:
        print("in one build only: " + ", ".join(missing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
