"""Store connection options at the CLI edge (cli/store_options.py), and lazy SDK imports."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner
from lading.cli.store_options import STORE_OPTION_NAMES, pop_store_config, store_options


@click.command()
@store_options
def probe(**options: object) -> None:
    config = pop_store_config(options)
    click.echo(f"{config.endpoint_url}|{config.profile}|{config.no_sign_request}|{config.region}|{sorted(options)}")


def test_flags_override_environment():
    env = {
        "AWS_ENDPOINT_URL": "http://env:1",
        "AWS_ENDPOINT_URL_S3": "http://env-s3:2",
        "AWS_PROFILE": "envprof",
        "AWS_REGION": "eu-west-1",
    }
    runner = CliRunner()
    result = runner.invoke(probe, [], env=env)
    # AWS_PROFILE is left to botocore's own chain (so environment keys keep their precedence).
    assert result.output.strip() == "http://env-s3:2|None|False|eu-west-1|[]"
    result = runner.invoke(
        probe,
        ["--endpoint-url", "http://flag:3", "--profile", "p", "--no-sign-request", "--region", "us-west-2"],
        env=env,
    )
    assert result.output.strip() == "http://flag:3|p|True|us-west-2|[]"


def test_help_names_the_environment_variables():
    result = CliRunner().invoke(probe, ["--help"])
    for text in ("--endpoint-url", "AWS_ENDPOINT_URL_S3", "--profile", "--no-sign-request", "--region"):
        assert text in result.output
    assert len(STORE_OPTION_NAMES) == 4


def test_opening_stores_imports_no_sdk():
    code = (
        "import sys; from lading.stores import open_store, StoreConfig;"
        "open_store('s3://bucket/x', StoreConfig()); open_store('gs://bucket/x', StoreConfig());"
        "print(sorted(m for m in ('boto3', 'botocore', 'google.cloud.storage') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
