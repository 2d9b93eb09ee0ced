#!/usr/bin/env python3
"""The table BENCHMARKS.md opens with, made from a scripts/bench-store run.

    scripts/bench-summary.py [RESULTS.jsonl]     # default docs/bench-store-reads-results.jsonl
    scripts/bench-summary.py --check BENCHMARKS.md

Prints the markdown table: per setup (the default, fencegate on its
embedded store; fencegate in front of Garage), op and concurrency, the
throughput, p50 and p99 and CPU per request, each beside the store alone in
the same run. With --check, exits 1 when the table between the markers
`<!-- summary:begin -->` and `<!-- summary:end -->` in the given file is not
the one the results make (scripts/check-links runs it): the figures in the
opening screen are always the ones the results file holds.
"""
import json
import statistics
import sys
from collections import defaultdict

RESULTS = "docs/bench-store-reads-results.jsonl"
BEGIN, END = "<!-- summary:begin -->", "<!-- summary:end -->"

# (setup, store measured, store alone it is set beside)
SETUPS = [
    ("default: fencegate on its embedded store", "fencegate", "embedded"),
    ("fencegate in front of Garage", "fencegate-garage", "garage"),
]


def pooled(runs):
    ok = sum(r["ok"] for r in runs)
    secs = sum(r["elapsed_s"] for r in runs)
    med = lambda k: statistics.median(r[k] for r in runs)
    return {
        "rps": ok / secs,
        "p50": med("p50_ms"),
        "p99": med("p99_ms"),
        "cpu": med("store_cpu_us_per_req"),
        "errors": sum(r["errors"] for r in runs),
    }


def table(path):
    by = defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        if "phase" in r.get("tags", {}) or r.get("size_name") != "4KiB":
            continue
        by[(r["op"], r["concurrency"], r["store"])].append(r)
    out = [
        "| setup | op | c | req/s | × alone | p50 ms | p99 ms | CPU µs/req | × alone | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for setup, store, alone in SETUPS:
        for op in ("get", "head", "put"):
            for c in (1, 32):
                if (op, c, store) not in by or (op, c, alone) not in by:
                    continue
                f, a = pooled(by[(op, c, store)]), pooled(by[(op, c, alone)])
                # In front of Garage the CPU is fencegate's own: Garage's is
                # its own process's, not a part of it.
                cpu_vs = f"{f['cpu'] / a['cpu']:.2f}" if store == "fencegate" else "own"
                out.append(
                    f"| {setup} | {op.upper()} | {c} | {f['rps']:,.0f} | {f['rps'] / a['rps']:.2f} | "
                    f"{f['p50']:.2f} | {f['p99']:.2f} | {f['cpu']:,.0f} | {cpu_vs} | {f['errors']} |"
                )
    for op, c in (("get", 1), ("get", 32), ("head", 1), ("head", 32)):
        n, a = by.get((op, c, "nginx-static")), by.get((op, c, "embedded"))
        if n and a:
            n, a = pooled(n), pooled(a)
            out.append(
                f"| the floor: nginx serving the file | {op.upper()} | {c} | {n['rps']:,.0f} | "
                f"{n['rps'] / a['rps']:.2f} | {n['p50']:.2f} | {n['p99']:.2f} | {n['cpu']:,.0f} | "
                f"{n['cpu'] / a['cpu']:.2f} | {n['errors']} |"
            )
    return "\n".join(out)


def main():
    args = sys.argv[1:]
    if args[:1] == ["--check"]:
        text = open(args[1]).read()
        if BEGIN not in text or END not in text:
            print(f"{args[1]}: no {BEGIN} ... {END} block")
            return 1
        shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
        made = table(args[2] if len(args) > 2 else RESULTS)
        if shown != made:
            print(f"{args[1]}: the summary table is not the one {RESULTS} makes; "
                  f"rerun scripts/bench-summary.py and paste it:\n{made}")
            return 1
        print(f"ok {args[1]} summary table matches {RESULTS}")
        return 0
    print(table(args[0] if args else RESULTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
