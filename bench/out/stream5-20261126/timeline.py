import sys, collections
rows = [l.split() for l in open(sys.argv[1])]
rows = [(p, k, w, float(a), float(b)) for p, k, w, a, b in rows]
dls = [(a, b) for p, k, w, a, b in rows if k == "dl"]
maps = [(a, b, p, k, w) for p, k, w, a, b in rows if k.startswith("map")]
t0 = min(a for a, b in dls); t1 = max(b for a, b in dls)
# time with n downloads in flight
ev = sorted([(a, 1) for a, b in dls] + [(b, -1) for a, b in dls])
hist = collections.Counter(); n = 0; last = ev[0][0]
for t, d in ev:
    hist[n] += t - last; n += d; last = t
print("span %.2f s, downloads %d, mean %.3f s" % (t1 - t0, len(dls), sum(b - a for a, b in dls) / len(dls)))
print("in flight:", {k: round(v, 2) for k, v in sorted(hist.items())})
slow = [m for m in maps if m[1] - m[0] > 0.02]
print("map waits > 20 ms:", len(slow), "total %.2f s" % sum(b - a for a, b, *_ in slow), "warm:", sum(1 for m in slow if m[3] == "mapW"))
for a, b, p, k, w in sorted(slow)[:60]:
    print(f"  {a - t0:7.2f} {b - a:5.2f} pid {p} {k} shard {w}")
