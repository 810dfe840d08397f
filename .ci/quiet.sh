# Sourced by .ci/setup: run apt-get and pip without the noise that makes a fresh setup look
# failed, keeping real errors on stderr and the command's exit status (callers use pipefail).

# apt-get's stdout goes away; on stderr, debconf's notes on a minimal image ("debconf: delaying
# package configuration, since apt-utils is not installed", "unable to initialize frontend")
# and dpkg-preconfigure's are dropped. Anything else (E: ... errors) is kept.
quiet_apt() {
  "$@" 2>&1 >/dev/null | { grep -v -e '^debconf: ' -e '^dpkg-preconfigure: ' || true; } >&2
}

# pip quietly. setuptools' "Editable installation" box (a BuildBackendWarning, 10 lines, on every
# editable install of a package laid out like ours) is silenced in the build backend through
# PYTHONWARNINGS; pip's "WARNING: Location" lines from this machine's pip configuration are dropped.
quiet_pip() {
  PYTHONWARNINGS="ignore::UserWarning:setuptools.command.editable_wheel${PYTHONWARNINGS:+,$PYTHONWARNINGS}" \
    "${PIP_PYTHON:-.venv/bin/python}" -m pip -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v '^WARNING: Location' || true; }
}
