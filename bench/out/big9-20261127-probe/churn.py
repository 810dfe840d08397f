import mmap, time
m = mmap.mmap(-1, 3 << 30)
for off in range(0, len(m), 4096):
    m[off] = 1
m.close()
