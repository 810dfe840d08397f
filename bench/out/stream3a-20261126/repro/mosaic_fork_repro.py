"""Minimal reproduction: MosaicML streaming's S3Downloader, used once in the parent (as
StreamingDataset does for index.json), is inherited by forked DataLoader workers with its boto3
client and that client's open keep-alive connection; two workers downloading at the same time
then share one TCP connection, and a worker can receive the other's bytes."""
import hashlib, multiprocessing as mp, os, sys, tempfile, uuid
import boto3

endpoint = sys.argv[1]
os.environ["S3_ENDPOINT_URL"] = endpoint
types = __import__("types"); sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
from streaming.base.storage.download import S3Downloader

client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
bucket = f"bench-stream3a-repro-{uuid.uuid4().hex[:6]}"
client.create_bucket(Bucket=bucket)
try:
    bodies = {f"shard.{i:05d}.mds": os.urandom(20_000_000) for i in range(8)}
    for key, body in bodies.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    client.put_object(Bucket=bucket, Key="index.json", Body=b"{}")
    md5 = {k: hashlib.md5(v).hexdigest() for k, v in bodies.items()}
    folder = tempfile.mkdtemp(dir="/tmp/s3a/repro")
    downloader = S3Downloader()
    downloader.download(f"s3://{bucket}/index.json", f"{folder}/index.json")  # parent: client + pooled socket

    def worker(keys, out, queue):
        for key in keys:
            try:
                downloader.download(f"s3://{bucket}/{key}", out + key)
                got = hashlib.md5(open(out + key, "rb").read()).hexdigest()
                queue.put((key, "same" if got == md5[key] else "DIFFERENT BYTES"))
            except Exception as err:
                queue.put((key, f"error: {type(err).__name__}: {str(err)[:80]}"))

    mode = sys.argv[2] if len(sys.argv) > 2 else "fork"
    ctx = mp.get_context("fork")
    results = []
    for trial in range(int(sys.argv[3]) if len(sys.argv) > 3 else 5):
        if mode == "fork-clean":
            downloader.clean_up()  # drop the parent's client (and its connection) before forking
        queue = ctx.Queue()
        keys = sorted(bodies)
        procs = [ctx.Process(target=worker, args=(keys[w::2], f"{folder}/{trial}-{w}-", queue)) for w in range(2)]
        for p in procs: p.start()
        for p in procs: p.join(300)
        got = [queue.get(timeout=5)[1] for _ in keys]
        print(f"trial {trial}: {sum(g == 'same' for g in got)} of {len(got)} downloads intact; "
              f"{sum(g == 'DIFFERENT BYTES' for g in got)} with another object's bytes; "
              f"{sum(g.startswith('error') for g in got)} errors {[g for g in got if g.startswith('error')][:1]}", flush=True)
        import shutil; shutil.rmtree(folder); os.makedirs(folder)
        downloader.download(f"s3://{bucket}/index.json", f"{folder}/index.json")
finally:
    for key in list(bodies) + ["index.json"]:
        client.delete_object(Bucket=bucket, Key=key)
    client.delete_bucket(Bucket=bucket)
