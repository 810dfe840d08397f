# mmap, safetensors and torch.load(mmap=True) on a lading mount, page cache (0) and FOPEN_DIRECT_IO (1)
for v in 0 1; do
  LADING_MOUNT_DIRECT_IO=$v AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 /work/wt-mount9/.venv/bin/lading mount s3://bench-mount9-probe/p/ mnt --endpoint-url http://127.0.0.1:7480 >/dev/null
  echo "== direct_io=$v (kernel $(uname -r), libfuse $(dpkg-query -W -f='${Version}' libfuse3-3))"
  /work/wt-mount9/.venv/bin/python probe.py mnt/a.bin
  /work/wt-mount9/.venv/bin/python -c "
import safetensors, torch
from safetensors import safe_open
try:
    with safe_open('mnt/w.safetensors', 'np') as f: print('safetensors', safetensors.__version__, 'safe_open (MAP_PRIVATE) ok', f.get_tensor('w')[:3])
except Exception as e: print('safe_open FAILED', type(e).__name__, e)
try: print('torch', torch.__version__, 'torch.load(mmap=True) (MAP_PRIVATE) ok', torch.load('mnt/w.pt', mmap=True)['w'][:3])
except Exception as e: print('torch.load mmap FAILED', type(e).__name__, e)
"
  /work/wt-mount9/.venv/bin/lading unmount mnt >/dev/null
done
