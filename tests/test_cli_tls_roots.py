"""A client that never makes a TLS connection is built without reading the system's folder of root
certificates (``lading sync`` from a plain ``http://`` endpoint), and the environment is as before
once it is built (lading.cli.store_options.unused_roots_skipped)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lading.cli.store_options import BUNDLES, NO_ROOTS
from sync_fixtures import BUCKET, put_objects, read_tree, s3_client

SYSTEM_BUNDLE = next((path for path in BUNDLES if os.path.isfile(path)), None)


@pytest.mark.skipif(SYSTEM_BUNDLE is None, reason="no system bundle of root certificates")
def test_a_sync_from_a_plain_http_endpoint_does_not_read_the_folder_of_roots(lading, s3_env, tmp_path, monkeypatch):
    """A folder of roots holding only an unusable certificate: rustls refuses to build a client
    that loads it (obstore's 'builder error'); the sync never loads it, so it works."""
    assert s3_env["AWS_ENDPOINT_URL"].startswith("http://")
    put_objects(s3_client(s3_env), {"a.bin": b"a" * 100})
    roots = tmp_path / "roots"
    roots.mkdir()
    (roots / "bad.pem").write_text("-----BEGIN CERTIFICATE-----\nTUlJQmFkQ2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # else its roots, valid, would be loaded too
    monkeypatch.setenv("SSL_CERT_DIR", str(roots))
    result = lading("sync", f"s3://{BUCKET}/data", str(tmp_path / "dest"))
    assert result.returncode == 0, result.stderr
    assert read_tree(tmp_path / "dest") == {"a.bin": b"a" * 100}


@pytest.mark.skipif(SYSTEM_BUNDLE is None, reason="no system bundle of root certificates")
@pytest.mark.parametrize("source", ["data/a.bin", "data/"])  # one object (its HEAD first), a prefix
def test_cat_from_a_plain_http_endpoint_does_not_read_the_folder_of_roots(
    lading, s3_env, tmp_path, monkeypatch, source
):
    """As for sync: `lading cat` builds its client (before the HEAD that decides whether SOURCE
    names one object) without loading the unusable certificate."""
    put_objects(s3_client(s3_env), {"a.bin": b"a" * 100})
    roots = tmp_path / "roots"
    roots.mkdir()
    (roots / "bad.pem").write_text("-----BEGIN CERTIFICATE-----\nTUlJQmFkQ2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.setenv("SSL_CERT_DIR", str(roots))
    result = lading("cat", f"s3://{BUCKET}/{source}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "a" * 100


#: Run in a fresh process (the window opens only while no other thread runs): the two variables
#: inside the window and after it, for StoreConfig(**argv[1]) and the scheme argv[2].
WINDOW = """
import json, os, sys
from lading.cli.store_options import unused_roots_skipped
from lading.stores.config import StoreConfig
names = ("SSL_CERT_FILE", "SSL_CERT_DIR")
with unused_roots_skipped(StoreConfig(**json.loads(sys.argv[1])), sys.argv[2]):
    inside = [os.environ.get(name) for name in names]
print(json.dumps([inside, [os.environ.get(name) for name in names]]))
"""


def window(config: dict, scheme: str, user_file: str | None, user_dir: str | None) -> tuple[list, list]:
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    env.update({k: v for k, v in (("SSL_CERT_FILE", user_file), ("SSL_CERT_DIR", user_dir)) if v is not None})
    done = subprocess.run(
        [sys.executable, "-c", WINDOW, json.dumps(config), scheme], env=env, capture_output=True, text=True, check=True
    )
    inside, after = json.loads(done.stdout)
    return inside, after


@pytest.mark.parametrize("user_file", [None, "/somewhere/bundle.pem"])
@pytest.mark.parametrize("user_dir", [None, "/somewhere/certs"])
def test_the_roots_are_narrowed_only_while_the_client_is_built(user_file, user_dir):
    if user_file is None and SYSTEM_BUNDLE is None:
        pytest.skip("no system bundle of root certificates")
    inside, after = window({"endpoint_url": "http://127.0.0.1:9"}, "s3", user_file, user_dir)
    assert inside == [user_file or SYSTEM_BUNDLE, NO_ROOTS]
    assert after == [user_file, user_dir]


@pytest.mark.parametrize(
    "config, scheme",
    [
        ({"endpoint_url": "https://127.0.0.1:9"}, "s3"),  # TLS: the user's roots, all of them
        ({}, "s3"),  # AWS itself
        ({"endpoint_url": "http://127.0.0.1:9", "http_proxy": "https://proxy:3128"}, "s3"),  # TLS to a proxy
        ({"endpoint_url": "http://127.0.0.1:9"}, "file"),
    ],
)
def test_roots_stay_as_they_are_when_tls_may_be_used(config, scheme):
    inside, after = window(config, scheme, None, "/somewhere/certs")
    assert inside == after == [None, "/somewhere/certs"]
