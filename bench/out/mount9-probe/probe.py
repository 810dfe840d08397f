import mmap, os, sys, hashlib
p = sys.argv[1]
data = bytes(range(256)) * (3 * 4096 + 17)
with open(p, "rb", buffering=0) as f:
    got = f.read()
print("read ok", got == data, len(got))
fd = os.open(p, os.O_RDONLY)
for name, kw in [("shared ACCESS_READ", dict(access=mmap.ACCESS_READ)), ("private ACCESS_COPY", dict(access=mmap.ACCESS_COPY)), ("MAP_SHARED PROT_READ", dict(flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)), ("MAP_PRIVATE PROT_READ", dict(flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ))]:
    try:
        m = mmap.mmap(fd, 0, **kw)
        print(name, "ok", m[:] == data)
        m.close()
    except OSError as e:
        print(name, "FAILED", e)
try:
    import numpy as np
    a = np.memmap(p, dtype=np.uint8, mode="r")
    print("numpy memmap r ok", bytes(a[:10]) == data[:10])
except Exception as e:
    print("numpy memmap r FAILED", e)
try:
    import numpy as np
    a = np.memmap(p, dtype=np.uint8, mode="c")
    print("numpy memmap c ok", bytes(a[:10]) == data[:10])
except Exception as e:
    print("numpy memmap c FAILED", e)
