#!/usr/bin/env bash
# mypy reads modules from folders named as they import, and cannot follow the editable install's
# mapping of service/ -> zfab, api/ -> zfab.api, apiclient/ -> zfab.apiclient (setup.py). This lays
# out that mapping as symlinks under build/typecheck, which pyproject.toml's [tool.mypy] reads.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck/zfab
rm -rf build/typecheck
mkdir -p "$tree"
for entry in service/*; do
    case "$entry" in */__pycache__) continue ;; esac
    ln -s "../../../$entry" "$tree/"
done
ln -s ../../../api ../../../apiclient "$tree/"
