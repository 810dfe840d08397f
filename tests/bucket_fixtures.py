"""Test set-up shared by the datalayer tests: a fresh bucket on the S3 or GCS test server (made
through the SDKs directly; the code under test never sees these clients)."""

from __future__ import annotations

import uuid

from lading.stores.config import StoreConfig


def make_bucket(scheme: str, config: StoreConfig, label: str, folder: str) -> str:
    """A new bucket named ``LABEL-<random>``; returns ``SCHEME://BUCKET/FOLDER``."""
    name = f"{label}-{uuid.uuid4().hex[:10]}"
    if scheme == "s3":
        import boto3

        key, secret, _ = config.env_credentials
        boto3.client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=key,
            aws_secret_access_key=secret,
        ).create_bucket(Bucket=name)
    else:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        storage.Client(
            project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": config.gcs_endpoint}
        ).create_bucket(name)
    return f"{scheme}://{name}/{folder}"
