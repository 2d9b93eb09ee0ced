#!/usr/bin/env python3
"""The tables BENCHMARKS.md opens with, made from the results files.

    scripts/bench-summary.py [RESULTS.jsonl]     # default docs/bench-store-reads-results.jsonl
    scripts/bench-summary.py --ratios            # the fencegate/nginx table
    scripts/bench-summary.py --check BENCHMARKS.md

The fencegate/nginx table (between `<!-- ratios:begin -->` and
`<!-- ratios:end -->`): fencegate's throughput and CPU per request each
divided by nginx's in the same run, from three results files: reads on the
embedded store beside nginx serving the file (scripts/bench-store,
docs/bench-store-reads-keys-results.jsonl, pooled as below); PUTs in front
of Garage beside nginx proxying to it (scripts/bench,
docs/bench-results.jsonl, pooled as scripts/bench-report.py does); and the
proxy alone in front of the sink beside nginx proxying to it
(scripts/bench-wrk with a ladder of the release and the PGO build,
docs/bench-wrk-pgo-keys-2-results.jsonl, pooled as scripts/bench-wrk does),
a row for each build.

The summary table (the default RESULTS): per setup (the default, fencegate on its
embedded store; fencegate in front of Garage), op and concurrency, the
throughput, p50 and p99 and CPU per request, each beside the store alone in
the same run. With --check, exits 1 when the table between the markers
`<!-- summary:begin -->` and `<!-- summary:end -->` in the given file is not
the one the results make, and likewise for the ratios block (scripts/check-links
runs it): the figures in the opening screen are always the ones the results
files hold.
"""
import json
import statistics
import sys
from collections import defaultdict

RESULTS = "docs/bench-store-reads-results.jsonl"
BEGIN, END = "<!-- summary:begin -->", "<!-- summary:end -->"
RATIOS_BEGIN, RATIOS_END = "<!-- ratios:begin -->", "<!-- ratios:end -->"
BENCH = "docs/bench-results.jsonl"
READS = "docs/bench-store-reads-keys-results.jsonl"
WRK = "docs/bench-wrk-pgo-keys-2-results.jsonl"

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


def wrk_pooled(path, form, proxy):
    """scripts/bench-wrk's pooling: req/s the mean of the rounds', CPU per
    request weighted by each round's requests."""
    rs = [r for r in map(json.loads, open(path))
          if r.get("kind") == "wrk" and r["form"] == form and r["path"] == proxy]
    if not rs:
        return None
    n = sum(r["requests"] for r in rs)
    return {"rps": sum(r["rps"] for r in rs) / len(rs),
            "cpu": sum(r["cpu_us_per_req"] * r["requests"] for r in rs) / n}


def bench_pooled(path, backend, size, c, proxy):
    """scripts/bench-report.py's pooling: req/s all successful requests over
    all the time, CPU per request weighted by each round's requests."""
    rs = [r for r in map(json.loads, open(path))
          if r.get("kind") == "load" and r["backend"] == backend and r["size_name"] == size
          and r["concurrency"] == c and r["path"] == proxy]
    if not rs:
        return None
    w = [(r["proxy_cpu_us_per_req"], r["ok"] + r["errors"]) for r in rs]
    return {"rps": sum(r["ok"] for r in rs) / sum(r["elapsed_s"] for r in rs),
            "cpu": sum(c_ * n for c_, n in w) / sum(n for _, n in w)}


def rate(v):
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def micros(v):
    return f"{v:,.0f}" if v >= 1000 else f"{v:.1f}"


def ratios():
    """fencegate against nginx, in the same run, from the three results files."""
    rows = []
    by = defaultdict(list)
    for line in open(READS):
        r = json.loads(line)
        if "phase" in r.get("tags", {}) or r.get("size_name") != "4KiB":
            continue
        by[(r["op"], r["concurrency"], r["store"])].append(r)
    for op in ("get", "head"):
        for c in (1, 32):
            f, n = by.get((op, c, "fencegate")), by.get((op, c, "nginx-static"))
            if f and n:
                rows.append(("default: its embedded store",
                             f"{op.upper()} 4 KiB", c, pooled(f), pooled(n), "A"))
    for size in ("4KiB", "256MiB"):
        for c in (1, 32):
            f, n = (bench_pooled(BENCH, "garage", size, c, p) for p in ("fencegate", "nginx"))
            if f and n:
                rows.append(("in front of Garage",
                             f"PUT {size[:-3]} {size[-3:]}", c, f, n, "B"))
    for build, setup in (("release", "in front of the sink"),
                         ("pgo", "in front of the sink, PGO build")):
        for form, what in (("presigned", "PUT 4 KiB, presigned"),
                           ("sha256", "PUT 4 KiB, header-signed"),
                           ("get", "GET 4 KiB"),
                           ("list", "LIST, empty")):
            f = wrk_pooled(WRK, form, f"fencegate:{build}")
            n = wrk_pooled(WRK, form, "nginx")
            if f and n:
                rows.append((setup, what, 32, f, n, "C"))
    out = [
        "| setup | op | c | req/s: fencegate ÷ nginx | CPU µs/req: fencegate ÷ nginx | run |",
        "|---|---|---|---|---|---|",
    ]
    for setup, op, c, f, n, run in rows:
        out.append(
            f"| {setup} | {op} | {c} | **{f['rps'] / n['rps']:.2f}** "
            f"({rate(f['rps'])} ÷ {rate(n['rps'])}) | **{f['cpu'] / n['cpu']:.2f}** "
            f"({micros(f['cpu'])} ÷ {micros(n['cpu'])}) | {run} |"
        )
    return "\n".join(out)


def check_block(path, text, begin, end, made, what):
    if begin not in text or end not in text:
        print(f"{path}: no {begin} ... {end} block")
        return False
    shown = text.split(begin, 1)[1].split(end, 1)[0].strip()
    if shown != made:
        print(f"{path}: the {what} is not the one its results make; "
              f"rerun scripts/bench-summary.py and paste it:\n{made}")
        return False
    print(f"ok {path} {what} matches its results")
    return True


def main():
    args = sys.argv[1:]
    if args[:1] == ["--check"]:
        text = open(args[1]).read()
        results = args[2] if len(args) > 2 else RESULTS
        ok = check_block(args[1], text, BEGIN, END, table(results), "summary table")
        ok &= check_block(args[1], text, RATIOS_BEGIN, RATIOS_END, ratios(),
                          "fencegate/nginx table")
        return 0 if ok else 1
    if args[:1] == ["--ratios"]:
        print(ratios())
        return 0
    print(table(args[0] if args else RESULTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
