import subprocess, sys, time, os
root = sys.argv[1]; dest = "/tmp/big8-d"
subprocess.run(["rm", "-rf", dest]); os.mkdir(dest)
t0 = time.time()
p = subprocess.run([f"{root}/.venv/bin/python", "/tmp/big8-tl/run.py", repr(t0), "sync", "s3://bench-big8/big/", dest, "--endpoint-url", "http://127.0.0.1:7480", "--no-cache", "--json"], capture_output=True, text=True, cwd=root)
t1 = time.time()
print(p.stderr, end="")
print(f"{(t1 - t0) * 1000:8.1f} ms  process reaped (wall)")
import json; print("json seconds", json.loads(p.stdout)["seconds"] if p.stdout else p.stdout)
