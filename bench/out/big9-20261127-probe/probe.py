import asyncio, collections, statistics, sys, time
from datetime import timedelta
import obstore
from obstore.store import S3Store
store = S3Store("bench-big9", endpoint="http://127.0.0.1:7480", region="us-east-1", access_key_id="test",
    secret_access_key="test", virtual_hosted_style_request=False, client_options={"allow_http": True})
async def main():
    head = await obstore.head_async(store, "big/blob.bin")
    print("head", head["size"], head["e_tag"])
    for part in (8 << 20, 16 << 20):
        sizes = []
        types = set()
        async def one(start):
            r = await obstore.get_async(store, "big/blob.bin", options={"range": (start, start + part), "if_match": head["e_tag"]})
            s = r.stream(min_chunk_size=0)
            n = 0
            async for p in s:
                types.add(type(p).__name__); sizes.append(len(p)); n += 1
            return n
        counts = await asyncio.gather(*(one(i * part) for i in range(8)))
        print(f"part {part>>20} MiB: pieces per part {counts}; types {types}; piece sizes KiB median {statistics.median(sizes)/1024:.0f} mean {statistics.mean(sizes)/1024:.0f} min {min(sizes)/1024:.1f} max {max(sizes)/1024:.0f}")
        hist = collections.Counter(min(s // (64 << 10), 8) for s in sizes)
        print("  histogram (64 KiB buckets, 8=>=512K):", sorted(hist.items()))
    r = await obstore.get_async(store, "big/blob.bin", options={"range": (0, 1 << 20)})
    s = r.stream(min_chunk_size=0); p = await s.__anext__()
    async for _ in s: pass
    print("piece type", type(p), "memoryview readonly", memoryview(p).readonly)
asyncio.run(main())
