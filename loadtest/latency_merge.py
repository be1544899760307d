"""Merge the storm fleet's publish->delivery histograms (one per generator process).

Each generator's JSON line carries `latency.buckets`: `[[value_ns, count], ...]` of its
HDR histogram (loadtest/src/storm/latency.rs). Every generator uses the same bounds and
precision, so the buckets line up and adding the counts per value is the exact merge;
percentiles are then read as HDR reads them (the first bucket whose cumulative count
reaches round(q * total), at least 1). Used by storm.sh and storm-hold.sh.
"""


def merge(gens):
    """Fleet-wide latency (µs) from the generators' JSON lines."""
    buckets = {}
    for g in gens:
        for v, c in g.get("latency", {}).get("buckets", []):
            buckets[v] = buckets.get(v, 0) + c
    count = sum(buckets.values())
    vals = sorted(buckets)

    def q(p):
        if not count:
            return None
        rank, cum = max(1, int(p * count + 0.5)), 0
        for v in vals:
            cum += buckets[v]
            if cum >= rank:
                return round(v / 1000, 1)
        return round(vals[-1] / 1000, 1)

    return {"count": count, "p50_us": q(0.5), "p90_us": q(0.9), "p99_us": q(0.99),
            "p999_us": q(0.999), "max_us": round(vals[-1] / 1000, 1) if vals else None,
            "p99_us_per_generator": [g.get("latency", {}).get("p99_us") for g in gens],
            "merged": "histograms of every generator, bucket counts added"}


def ms(lat):
    """p50/p99/p999/max in ms, for the summary line."""
    return [None if lat[k] is None else round(lat[k] / 1000, 1)
            for k in ("p50_us", "p99_us", "p999_us", "max_us")]


if __name__ == "__main__":
    # Self-check: two generators, same bucket values, counts add.
    a = {"latency": {"p99_us": 2.0, "buckets": [[1000, 98], [2000, 2]]}}
    b = {"latency": {"p99_us": 9.0, "buckets": [[2000, 1], [9000, 1]]}}
    m = merge([a, b])
    assert m["count"] == 102 and m["p50_us"] == 1.0 and m["p99_us"] == 2.0 and m["max_us"] == 9.0, m
    assert merge([])["p99_us"] is None
    print("ok")
