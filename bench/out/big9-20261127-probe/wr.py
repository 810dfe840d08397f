import os, sys, resource, time
size, chunk = 1 << 30, int(sys.argv[1]) << 10
buf = memoryview(os.urandom(chunk))
fd = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.ftruncate(fd, size); os.posix_fallocate(fd, 0, size)
r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
for off in range(0, size, chunk):
    os.pwrite(fd, buf, off)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(f"write {chunk>>10:4d} KiB hot source: {time.perf_counter()-t:.2f} s wall, sys {r1.ru_stime-r0.ru_stime:.2f} user {r1.ru_utime-r0.ru_utime:.2f} minflt {r1.ru_minflt-r0.ru_minflt}")
