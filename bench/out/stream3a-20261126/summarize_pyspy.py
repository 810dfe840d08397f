"""Summarize py-spy raw (collapsed) stacks: samples per process and thread, and inclusive share of chosen frames."""
import collections, re, sys
path = sys.argv[1]
total = 0
per_proc = collections.Counter()
incl = collections.Counter()
leaf = collections.Counter()
for line in open(path):
    line = line.rstrip("\n")
    if not line:
        continue
    stack, _, count = line.rpartition(" ")
    n = int(count)
    frames = stack.split(";")
    total += n
    per_proc[frames[0][:60] + " | " + (frames[1][:40] if len(frames) > 1 else "")] += n
    seen = set()
    for f in frames:
        name = re.sub(r" \(.*?\)$", "", f).strip()
        fn = f.split(" (")[0]
        key = f
        if fn not in seen:
            seen.add(fn)
            incl[fn] += n
    leaf[frames[-1]] += n
print("total samples", total)
print("-- processes/threads")
for k, v in per_proc.most_common(12):
    print(f"{v:7d} {100*v/total:5.1f}% {k}")
print("-- inclusive, top 45")
for k, v in incl.most_common(45):
    print(f"{v:7d} {100*v/total:5.1f}% {k}")
print("-- leaf, top 25")
for k, v in leaf.most_common(25):
    print(f"{v:7d} {100*v/total:5.1f}% {k}")
