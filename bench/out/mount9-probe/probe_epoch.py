"""Two epochs of the 1 GiB through one mount (1 MiB reads): cold, then again (the kernel page cache, if any)."""
import json, os, subprocess, sys, time
from pathlib import Path
root, dio, bucket = sys.argv[1], sys.argv[2], sys.argv[3]
mnt = Path("/tmp/mount9/mep"); mnt.mkdir(exist_ok=True)
env = dict(os.environ, LADING_MOUNT_DIRECT_IO=dio, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")
out = subprocess.run([f"{root}/.venv/bin/python", "-m", "lading", "mount", f"s3://{bucket}/seq/", str(mnt), "--endpoint-url", "http://127.0.0.1:7480", "--json"], cwd=root, env=env, capture_output=True, text=True, check=True)
pid = json.loads(out.stdout)["pid"]
def cpu(p):
    f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
res = []
try:
    subprocess.run(["sync"]); Path("/proc/sys/vm/drop_caches").write_text("3\n")
    for epoch in (1, 2):
        d0, t0 = cpu(pid), time.monotonic()
        n = 0
        with open(mnt / "1GiB.bin", "rb", buffering=0) as f:
            while c := f.read(1 << 20): n += len(c)
        assert n == 1 << 30
        res.append(f"epoch {epoch} {time.monotonic()-t0:.3f} s daemon {cpu(pid)-d0:.2f}")
finally:
    subprocess.run(["fusermount3", "-u", str(mnt)])
print(f"dio={dio}", " | ".join(res), f"load {os.getloadavg()[0]:.1f}")
