import sys, collections, re
path = sys.argv[1]
incl = {k: collections.Counter() for k in ("main", "worker")}; leaf = {k: collections.Counter() for k in ("main", "worker")}; tot = collections.Counter()
main_pid = None
for line in open(path):
    stack, _, n = line.rstrip("\n").rpartition(" ")
    n = int(n)
    m = re.match(r'process (\d+):"(.*?)";(.*)$', stack)
    if not m: continue
    pid, cmd, rest = m.groups()
    if main_pid is None: main_pid = pid
    m2 = re.match(r'process (\d+):"(.*?)";(.*)$', rest)
    kind = "worker" if m2 else "main"
    if m2: rest = m2.group(3)
    tot[kind] += n
    names = [re.sub(r" \((.*?):\d+\)$", r" (\1)", f) for f in rest.split(";")]
    leaf[kind][names[-1]] += n
    for f in set(names):
        incl[kind][f] += n
print(tot)
for kind in ("worker", "main"):
    W = tot[kind]
    print(f"--- inclusive ({kind})")
    for f, n in incl[kind].most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 60): print(f"{100*n/W:5.1f}% {f}")
    print(f"--- leaf ({kind})")
    for f, n in leaf[kind].most_common(30): print(f"{100*n/W:5.1f}% {f}")
