import json, sys, collections
for path in sys.argv[1:]:
    rows = json.load(open(path))["results"]
    by = collections.defaultdict(dict)
    for r in rows:
        by[(r["case"], r["round"])][r["tool"]] = r
    print(path)
    for (case, rnd), tools in sorted(by.items()):
        l, b, d, s = (tools.get(t) for t in ("lading", "lading-base", "direct", "s3fs"))
        parts = [f"{case} r{rnd+1}"]
        for name, t in (("lading", l), ("base", b), ("direct", d), ("s3fs", s)):
            if t: parts.append(f"{name} {t['seconds']:.3f}s d{t['cpu_s']:.2f} r{t.get('reader_cpu_s','-')} s{t.get('server_cpu_s','-')}")
        if l and b: parts.append(f"base/lading {b['seconds']/l['seconds']:.2f}x")
        if l and d: parts.append(f"lading/direct speed {d['seconds']/l['seconds']:.2f}")
        if b and d: parts.append(f"base/direct speed {d['seconds']/b['seconds']:.2f}")
        print("  " + " | ".join(parts))
