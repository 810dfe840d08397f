"""Connection settings resolved at the edge, and a sync with keys in the environment that
never loads botocore (obstore signs with the keys it is given)."""

import subprocess
import sys

import pytest
from lading.cli.context import store_config
from lading.core.errors import UsageError

BASE = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_REGION": "eu-west-1"}


def test_env_keys_become_static_credentials_hidden_from_repr():
    config = store_config(env={**BASE, "AWS_SESSION_TOKEN": "tok"})
    assert config.env_credentials == ("AKIDEXAMPLE", "s3cr3t", "tok")
    assert "s3cr3t" not in repr(config)


@pytest.mark.parametrize(
    "extra,kwargs",
    [
        ({"AWS_PROFILE": "dev"}, {}),  # a profile in the environment: botocore's chain decides
        ({}, {"profile": "dev"}),  # --profile: the profile wins over environment keys
        ({}, {"no_sign_request": True}),  # unsigned requests carry no keys at all
    ],
)
def test_full_chain_kept_when_a_profile_or_no_signing_is_asked_for(extra, kwargs):
    assert store_config(env={**BASE, **extra}, **kwargs).env_credentials is None


def test_profile_comes_from_the_flag_only():
    assert store_config(env={**BASE, "AWS_PROFILE": "dev"}).profile is None
    assert store_config(profile="ops", env=BASE).profile == "ops"


@pytest.mark.parametrize("name,value", [("LADING_RETRIES", "many"), ("LADING_TIMEOUT", "-1"), ("LADING_RETRIES", "0")])
def test_bad_numeric_settings_are_usage_errors(name, value):
    with pytest.raises(UsageError, match=name):
        store_config(env={**BASE, name: value})


def test_sync_with_env_keys_never_imports_botocore(s3_env, tmp_path):
    """Static keys, an endpoint and a region from the environment: the listing and the GETs go
    through obstore alone. boto3 / botocore are imported only for what obstore does not do:
    uploads, region discovery (no region configured), exact listings (an empty object that may
    be a ``dir/`` marker, keys obstore cannot render), the SSE-KMS check after an MD5 mismatch,
    and reads in a forked child. The objects here need none of that (none is empty)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"])
    client.create_bucket(Bucket="lean")
    for i in range(3):
        client.put_object(Bucket="lean", Key=f"p/{i}.bin", Body=b"x" * (i + 1))
    dest = tmp_path / "out"
    code = (
        "import sys\n"
        "from lading.cli.main import main  # the command without console()'s os._exit\n"
        f"sys.argv = ['lading', 'sync', 's3://lean/p', {str(dest)!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as done:\n"
        "    print('exit', done.code)\n"
        "print(sorted(name for name in ('boto3', 'botocore', 'obstore') if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    *_, exit_line, loaded = result.stdout.splitlines()
    assert exit_line == "exit 0", result.stderr
    assert sorted(path.name for path in dest.iterdir() if not path.name.startswith(".lading")) == [
        "0.bin",
        "1.bin",
        "2.bin",
    ]
    assert (dest / "2.bin").read_bytes() == b"xxx"
    assert loaded == "['obstore']"
