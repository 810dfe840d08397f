"""Mount (lading at ROOT, env LADING_MOUNT_DIRECT_IO=DIO), drop caches, read the 1 GiB in BLOCK reads in a
child process; print wall, daemon CPU, reader CPU, RGW+OSD CPU, machine CPU (/proc/stat busy), daemon reads."""
import json, os, re, subprocess, sys, time, resource
from pathlib import Path
root, dio, block, bucket = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
mnt = Path("/tmp/mount9/mseq"); mnt.mkdir(exist_ok=True)
log = Path(f"/tmp/mount9/seq-{os.getpid()}.log")
env = dict(os.environ, LADING_MOUNT_DIRECT_IO=dio, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")
out = subprocess.run([f"{root}/.venv/bin/python", "-m", "lading", "mount", f"s3://{bucket}/seq/", str(mnt), "--endpoint-url", "http://127.0.0.1:7480", "--json", "--log-file", str(log)], cwd=root, env=env, capture_output=True, text=True, check=True)
pid = json.loads(out.stdout)["pid"]
def cpu(p):
    f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
def busy():
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = f[3] + f[4]
    return (sum(f[:8]) - idle) / os.sysconf("SC_CLK_TCK")
servers = [int(l.split()[0]) for l in subprocess.run(["pgrep", "-f", "radosgw|ceph-osd"], capture_output=True, text=True).stdout.split()]
try:
    os.stat(mnt / "1GiB.bin")
    subprocess.run(["sync"]); Path("/proc/sys/vm/drop_caches").write_text("3\n")
    d0, s0, b0 = cpu(pid), sum(cpu(p) for p in servers), busy()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    aligned = os.environ.get("ALIGNED") == "1"
    code = f"""
n=0
with open({str(mnt / '1GiB.bin')!r}, 'rb', buffering=0) as f:
    while c := f.read({block}): n += len(c)
assert n == 1 << 30, n
""" if not aligned else f"""
import mmap
buf = memoryview(mmap.mmap(-1, {block}))
n=0
with open({str(mnt / '1GiB.bin')!r}, 'rb', buffering=0) as f:
    while k := f.readinto(buf): n += k
assert n == 1 << 30, n
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    d1, s1, b1 = cpu(pid), sum(cpu(p) for p in servers), busy()
    hwm = [l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("VmHWM")][0].split()[1]
    reader = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
finally:
    subprocess.run(["fusermount3", "-u", str(mnt)])
    time.sleep(0.5)
stats = [l for l in log.read_text().splitlines() if "stats " in l]
st = json.loads(stats[-1].split("stats ", 1)[1]) if stats else {}
reads = st.get("reads", 0)
print(f"dio={dio} block={block>>10}KiB{' aligned' if aligned else ''} root={Path(root).name} wall {wall:.3f} s  {1024/wall:.0f} MiB/s  daemon {d1-d0:.2f}  reader {reader:.2f}  rgw+osd {s1-s0:.2f}  machine {b1-b0:.2f} CPU-s  hwm {int(hwm)>>10} MiB  reads {reads} (mean {st.get('bytes_served',0)/max(reads,1)/1024:.0f} KiB)  load {os.getloadavg()[0]:.1f}")
log.unlink()
