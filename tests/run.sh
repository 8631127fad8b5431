#!/usr/bin/env bash
# Installs everything the tests need on a fresh machine, then runs them. README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
# The project (editable) with its test tools, at the versions the suite was tested with. torch==2.13.0
# takes the local CPU wheel on the project's machines, the standard build elsewhere.
python -m pip install -q --disable-pip-version-check -e ".[dev]" -c constraints.txt
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
    || echo "warning: could not install Debian chromium; browser tests will fail" >&2
fi
python -m eagle2 fetch            # the embedded default model: fetched once, sha256-checked, cached
python -m pytest -q -p no:cacheprovider "$@"
