"""SageMaker training containers: which host this is, how many GPUs it has, which input channels exist.

SageMaker starts the entry point once per host (instance). What it tells the container:

- the training toolkit's variables: ``SM_CURRENT_HOST`` (``algo-2``), ``SM_HOSTS`` (a JSON list),
  ``SM_NUM_GPUS``, ``SM_CHANNELS`` (a JSON list of channel names) and ``SM_CHANNEL_<NAME>``
  (the channel's directory, ``/opt/ml/input/data/<name>``);
- in every training container, with or without the toolkit: ``resourceconfig.json``
  (``{"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], ...}``) and
  ``inputdataconfig.json`` (one entry per channel) in ``/opt/ml/input/config`` (the toolkit's
  ``SM_INPUT_CONFIG_DIR``).

The node rank is the index of the current host among the sorted host names (SageMaker names
them ``algo-1``, ``algo-2``, ...; the toolkit and ``resourceconfig.json`` list them sorted).
The environment is passed in as a mapping and the configuration directory is a parameter, so
nothing here reads ``os.environ``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from lading.core.errors import UsageError

#: Where SageMaker puts the job's configuration files (the toolkit's ``SM_INPUT_CONFIG_DIR``).
DEFAULT_CONFIG_DIR = Path("/opt/ml/input/config")
#: Where SageMaker puts each channel's data: ``<dir>/<channel>``.
DEFAULT_DATA_DIR = Path("/opt/ml/input/data")


class SageMakerHosts:
    """This host's place among the job's hosts. ``origin`` names where each value came from.
    A plain class: no caller compares, hashes or copies one (a dataclass costs about 1 ms of
    start-up to create)."""

    __slots__ = ("current_host", "hosts", "gpus", "origin")

    def __init__(self, current_host: str, hosts: tuple[str, ...], gpus: int | None, origin: str) -> None:
        self.current_host = current_host
        self.hosts = hosts  # sorted
        self.gpus = gpus  # SM_NUM_GPUS (None: not set)
        self.origin = origin  # "SM_CURRENT_HOST" or the path of resourceconfig.json

    @property
    def node_rank(self) -> int:
        """Index of the current host among the sorted hosts."""
        return self.hosts.index(self.current_host)


def config_dir(env: Mapping[str, str]) -> Path:
    """The configuration directory: ``SM_INPUT_CONFIG_DIR``, else ``/opt/ml/input/config``."""
    return Path(env.get("SM_INPUT_CONFIG_DIR") or DEFAULT_CONFIG_DIR)


def _read_json(path: Path) -> Any | None:
    """The parsed file, or None when it does not exist; a usage error when it is unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read SageMaker's {path}: {err}") from None
    import json  # here, not at the top: the CLI starts faster outside SageMaker

    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(
            f"SageMaker's {path} is invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}"
        ) from None


def _host_list(value: Any, origin: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(h, str) and h for h in value):
        raise UsageError(
            f"{origin} is not a non-empty list of host names: {value!r}", 'SageMaker writes e.g. ["algo-1","algo-2"]'
        )
    return tuple(sorted(set(value)))


def _gpus(env: Mapping[str, str]) -> int | None:
    text = env.get("SM_NUM_GPUS", "").strip()
    if not text:
        return None
    try:
        count = int(text)
    except ValueError:
        raise UsageError(
            f"SM_NUM_GPUS={text!r} is not an integer", "fix the variable or pass --local-world-size"
        ) from None
    if count < 0:
        raise UsageError(f"SM_NUM_GPUS={text!r} is negative", "fix the variable or pass --local-world-size")
    return count


def read_hosts(env: Mapping[str, str], resource_config: str | Path | None = None) -> SageMakerHosts | None:
    """This host among the job's hosts, or None outside SageMaker.

    ``SM_CURRENT_HOST`` and ``SM_HOSTS`` come first; without them, ``resource_config`` (default:
    ``resourceconfig.json`` in :func:`config_dir`) is read when it exists. A current host that
    is not among the hosts, or malformed values, are usage errors naming their origin.
    """
    path = Path(resource_config) if resource_config is not None else config_dir(env) / "resourceconfig.json"
    current = env.get("SM_CURRENT_HOST", "").strip()
    hosts_text = env.get("SM_HOSTS", "").strip()
    if current:
        origin = "SM_CURRENT_HOST"
        if hosts_text:
            import json

            try:
                hosts = _host_list(json.loads(hosts_text), "SM_HOSTS")
            except json.JSONDecodeError:
                raise UsageError(
                    f"SM_HOSTS={hosts_text!r} is not a JSON list",
                    'SageMaker sets e.g. SM_HOSTS=\'["algo-1","algo-2"]\'',
                ) from None
        else:
            config = _read_json(path)
            if not isinstance(config, dict) or "hosts" not in config:
                raise UsageError(
                    f"SM_CURRENT_HOST is set but SM_HOSTS is not (and there is no {path} listing the hosts)",
                    "set SM_HOSTS or pass --node-rank/--world-size",
                )
            hosts = _host_list(config["hosts"], f"{path}: hosts")
    else:
        config = _read_json(path)
        if config is None:
            return None
        origin = str(path)
        if not isinstance(config, dict) or not isinstance(config.get("current_host"), str):
            raise UsageError(
                f"{path} has no current_host", 'SageMaker writes {"current_host": "algo-1", "hosts": ["algo-1", ...]}'
            )
        current = config["current_host"]
        hosts = _host_list(config.get("hosts"), f"{path}: hosts")
    if current not in hosts:
        raise UsageError(
            f"the current host {current!r} ({origin}) is not among the hosts {list(hosts)}",
            "fix SM_CURRENT_HOST/SM_HOSTS or pass --node-rank",
        )
    return SageMakerHosts(current, hosts, _gpus(env), origin)


def channels(
    env: Mapping[str, str], input_config: str | Path | None = None, data_dir: str | Path | None = None
) -> dict[str, str]:
    """The job's input channels, name -> directory.

    From the toolkit's ``SM_CHANNEL_<NAME>`` variables (named by ``SM_CHANNELS`` when it is set,
    else every ``SM_CHANNEL_*``); without any, from ``inputdataconfig.json`` (default: in
    :func:`config_dir`), each channel in ``<data_dir>/<name>`` (``SM_INPUT_DIR``/data, default
    ``/opt/ml/input/data``).
    """
    import json

    found: dict[str, str] = {}
    listed = env.get("SM_CHANNELS", "").strip()
    names: list[str] = []
    if listed:
        try:
            parsed = json.loads(listed)
        except json.JSONDecodeError:
            raise UsageError(f"SM_CHANNELS={listed!r} is not a JSON list of channel names") from None
        names = [name for name in parsed if isinstance(name, str)] if isinstance(parsed, list) else []
    for name in names:
        directory = env.get(f"SM_CHANNEL_{name.upper()}", "").strip()
        if directory:
            found[name] = directory
    if not names:
        for variable, directory in env.items():
            if variable.startswith("SM_CHANNEL_") and directory.strip():
                found[variable[len("SM_CHANNEL_") :].lower()] = directory.strip()
    if found or names:
        return dict(sorted(found.items()))
    path = Path(input_config) if input_config is not None else config_dir(env) / "inputdataconfig.json"
    config = _read_json(path)
    if not isinstance(config, dict):
        return {}
    root = (
        Path(data_dir)
        if data_dir is not None
        else (Path(env["SM_INPUT_DIR"]) / "data" if env.get("SM_INPUT_DIR") else DEFAULT_DATA_DIR)
    )
    return {name: str(root / name) for name in sorted(config) if isinstance(name, str) and name}


def channel_dest(
    env: Mapping[str, str],
    name: str | None = None,
    input_config: str | Path | None = None,
    data_dir: str | Path | None = None,
) -> str | None:
    """The directory of channel ``name`` (any case), or, with no name, of the only channel.

    Returns None when no name is given and the job has no channel (outside SageMaker). A name
    that is not a channel, or several channels and no name, are usage errors listing them.
    """
    found = channels(env, input_config, data_dir)
    listing = ", ".join(found) or "none"
    if name is not None:
        wanted = {channel.lower(): directory for channel, directory in found.items()}
        directory = wanted.get(name.lower())
        if directory is None:
            raise UsageError(
                f"no SageMaker channel {name!r} (SM_CHANNEL_{name.upper()} is not set); channels: {listing}",
                "name one of the job's input channels, or give DEST",
            )
        return directory
    if not found:
        return None
    if len(found) > 1:
        raise UsageError(
            f"DEST is missing and this SageMaker job has {len(found)} channels: {listing}",
            "pick one with --channel NAME, or give DEST",
        )
    return next(iter(found.values()))


__all__ = [
    "DEFAULT_CONFIG_DIR",
    "DEFAULT_DATA_DIR",
    "SageMakerHosts",
    "channel_dest",
    "channels",
    "config_dir",
    "read_hosts",
]
