"""Turns the JSON lines of scripts/bench into the ratio table and the plot.

Usage: bench-report.py RESULTS.jsonl TABLE.md PLOT.png

Per backend, PUT size and concurrency, each path's rounds are pooled:
throughput is all successful requests over all the time, p99 is the median
of the rounds' p99. Ratios are against the backend reached directly:
throughput ratio (higher is better, 1.0 = no cost) and p99 ratio (lower is
better, 1.0 = no added tail latency).
"""

import json
import statistics
import sys
from collections import defaultdict

SIZES = {"4KiB": 4 << 10, "1MiB": 1 << 20, "256MiB": 256 << 20}


def load(path):
    runs = defaultdict(list)
    other = []
    for line in open(path):
        r = json.loads(line)
        if r.get("kind") == "load" and r["size_name"] in SIZES:
            runs[(r["backend"], r["size_name"], r["concurrency"], r["path"])].append(r)
        else:
            other.append(r)
    return runs, other


def pooled(rs):
    ok = sum(r["ok"] for r in rs)
    secs = sum(r["elapsed_s"] for r in rs)
    return {
        "req_s": ok / secs if secs else 0.0,
        "mib_s": ok * SIZES[rs[0]["size_name"]] / (1 << 20) / secs if secs else 0.0,
        "p99": statistics.median(r["p99_ms"] for r in rs),
        "errors": sum(r["errors"] for r in rs),
        "cpu": cpu_per_request(rs),
        "rounds": len(rs),
    }


def cpu_per_request(rs):
    """The proxy's CPU µs per request over all rounds (None: no proxy)."""
    weighted = [(r["proxy_cpu_us_per_req"], r["ok"] + r["errors"]) for r in rs
                if r.get("proxy_cpu_us_per_req") is not None]
    n = sum(w for _, w in weighted)
    return sum(c * w for c, w in weighted) / n if n else None


def us(v):
    return "" if v is None else f"{v:.1f}"


def main():
    results, table_path, plot_path = sys.argv[1:4]
    runs, other = load(results)
    cells = sorted(
        {(b, s, c) for (b, s, c, _) in runs},
        key=lambda k: (k[0], SIZES[k[1]], k[2]),
    )
    stats = {k: pooled(v) for k, v in runs.items()}
    head = (
        "| backend | size | c | direct req/s | direct MiB/s | nginx/direct thr | fencegate/direct thr "
        "| direct p99 ms | nginx/direct p99 | fencegate/direct p99 "
        "| nginx CPU µs/req | fencegate CPU µs/req | errors |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for b, s, c in cells:
        d = stats.get((b, s, c, "direct"))
        n = stats.get((b, s, c, "nginx"))
        f = stats.get((b, s, c, "fencegate"))
        if not (d and n and f) or not d["req_s"]:
            continue
        errors = d["errors"] + n["errors"] + f["errors"]
        rows.append(
            f"| {b} | {s} | {c} | {d['req_s']:.1f} | {d['mib_s']:.1f} "
            f"| {n['req_s'] / d['req_s']:.2f} | {f['req_s'] / d['req_s']:.2f} "
            f"| {d['p99']:.2f} | {n['p99'] / d['p99']:.2f} | {f['p99'] / d['p99']:.2f} "
            f"| {us(n['cpu'])} | {us(f['cpu'])} | {errors} |"
        )
    extra = []
    for r in other:
        if r.get("kind") == "rss":
            extra.append(
                f"\nPeak RSS (VmHWM) of a fresh fencegate: {r['vmhwm_kib_before'] / 1024:.1f} MiB at start, "
                f"{r['vmhwm_kib_after'] / 1024:.1f} MiB after one client uploaded {r['object']} through it.\n"
            )
        if r.get("kind") == "machine":
            extra.append(
                f"\nMachine ({r['when']}): {r['cores']} cores, {r['cpu']}, load average {' '.join(r['loadavg'])}, "
                f"kernel {r['kernel']}{', quick mode' if r['quick'] else ''}.\n"
            )
    text = head + "\n".join(rows) + "\n" + "".join(extra)
    open(table_path, "w").write(text)
    print(text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(16, 7), constrained_layout=True)
    col = 0
    for b in ("garage", "sink"):
        for c in (1, 32):
            sizes = [s for s in SIZES if (b, s, c, "direct") in stats]
            for row, (metric, label) in enumerate((("mib_s", "MiB/s"), ("p99", "p99 ms"))):
                ax = axes[row][col]
                for path in ("direct", "nginx", "fencegate"):
                    ys = [stats[(b, s, c, path)][metric] if (b, s, c, path) in stats else None for s in sizes]
                    ax.plot(sizes, ys, marker="o", label=path)
                ax.set_yscale("log")
                ax.set_title(f"PUT to {b}, concurrency {c}")
                ax.set_ylabel(label)
                ax.grid(True, which="both", alpha=0.3)
                ax.legend()
            col += 1
    fig.savefig(plot_path, dpi=80)


if __name__ == "__main__":
    main()
