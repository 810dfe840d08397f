"""Deterministic half of the reproduction: after MosaicML's S3Downloader fetched one object in the
parent (StreamingDataset fetches index.json), forked workers hold the parent's pooled connection:
the same socket (same local port) in every worker."""
import multiprocessing as mp, os, sys, types, uuid
import boto3

endpoint = sys.argv[1]
os.environ["S3_ENDPOINT_URL"] = endpoint
sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
from streaming.base.storage.download import S3Downloader


def pooled_ports(downloader):
    if downloader._s3_client is None:
        return "no client (each worker makes its own)"
    manager = downloader._s3_client._endpoint.http_session._manager
    ports = []
    for pool in manager.pools._container.values():
        for conn in list(pool.pool.queue):
            if conn is not None and conn.sock is not None:
                ports.append(conn.sock.getsockname()[1])
    return f"pooled connection(s) from local port {ports}"


def worker(downloader, name):
    print(f"{name} pid {os.getpid()}: {pooled_ports(downloader)}", flush=True)


client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
bucket = f"bench-stream3a-sock-{uuid.uuid4().hex[:6]}"
client.create_bucket(Bucket=bucket)
try:
    client.put_object(Bucket=bucket, Key="index.json", Body=b"{}")
    for mode in ("as is", "clean_up() before fork"):
        downloader = S3Downloader()
        downloader.download(f"s3://{bucket}/index.json", f"/tmp/s3a/repro/index-{uuid.uuid4().hex}.json")
        if mode != "as is":
            downloader.clean_up()
        print(f"-- {mode}; parent pid {os.getpid()}: {pooled_ports(downloader)}", flush=True)
        procs = [mp.get_context("fork").Process(target=worker, args=(downloader, f"worker {i}")) for i in range(2)]
        [p.start() for p in procs]
        [p.join() for p in procs]
finally:
    client.delete_object(Bucket=bucket, Key="index.json")
    client.delete_bucket(Bucket=bucket)
