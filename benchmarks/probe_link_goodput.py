"""What payload rate does a link shaped to R carry?

``tc`` counts every byte through the token bucket, headers included, so one TCP
stream's payload (what a RecvTensor response is made of) crosses a link shaped to R at
less than R. The bench's bounds (bench/limit.py) divide payload bytes by R; this probe
measures the factor that turns them into wire time, on the bench's own shaped network
(cluster/netns.py): per rate, one TCP stream of ``--mib`` MiB each way between the PS
and a worker, ``--repeats`` times, the median goodput and the wire rate (bytes through
the sender's token bucket per second).

    sudo .venv/bin/python benchmarks/probe_link_goodput.py --rates 1991mbit,1698mbit

Needs root and tc (iproute2); without them it says so and exits (status 2). Writes the
JSON (``--out``, default results/probes/link-goodput/goodput.json).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tictac_hooks.bench.runner import provenance  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def measure(rates: list[int], mib: int, repeats: int) -> list[dict]:
    from benchmarks.lab import linkmeter
    from tictac_hooks.cluster import netns
    rows = []
    netns.cleanup_stale()
    with netns.ShapedNetwork(netns.cluster_hosts(1, 1), rate=rates[0]) as net:
        for rate in rates:
            net.reshape(rate=rate)
            for src, dst in (("ps0", "worker0"), ("worker0", "ps0")):
                runs = [linkmeter.bulk_transfer(net, src, dst, mib << 20, timeout_s=300)
                        for _ in range(repeats)]
                goodput = statistics.median(r["goodput_bits"] for r in runs)
                wire = statistics.median(r["wire_bits"] for r in runs)
                rows.append({"rate_bits": rate, "src": src, "dst": dst,
                             "goodput_bits": goodput, "wire_bits": wire,
                             "goodput_over_rate": goodput / rate,
                             "goodput_over_rate_range": [
                                 min(r["goodput_bits"] for r in runs) / rate,
                                 max(r["goodput_bits"] for r in runs) / rate],
                             "runs": runs})
                print(f"{rate / 1e6:.0f} Mbit/s {src} -> {dst}: goodput "
                      f"{goodput / 1e6:.0f} Mbit/s ({goodput / rate:.3f} of the rate), "
                      f"wire {wire / 1e6:.0f} Mbit/s", flush=True)
    return rows


def main(argv: list[str]) -> int:
    from tictac_hooks.cluster import netns
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="1991mbit,1698mbit",
                   help="comma-separated tc rates (e.g. 1gbit,1991mbit)")
    p.add_argument("--mib", type=int, default=128, help="MiB per transfer")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=os.path.join(HERE, "results", "probes", "link-goodput",
                                                 "goodput.json"))
    args = p.parse_args(argv)
    rates = [netns.rate_bits(r) for r in args.rates.split(",") if r.strip()]
    if not rates or args.mib < 1 or args.repeats < 1:
        p.error("give at least one rate, --mib >= 1 and --repeats >= 1")
    ok, why = netns.available()
    if not ok:
        print(f"SKIPPED: no shaped network here ({why}); this probe needs root and tc "
              "(iproute2).", flush=True)
        return 2
    rows = measure(rates, args.mib, args.repeats)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({**provenance(), "mib": args.mib, "repeats": args.repeats, "rows": rows},
                  f, indent=1)
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
