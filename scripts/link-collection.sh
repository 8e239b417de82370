#!/usr/bin/env bash
# Makes the checkout importable and runnable as the collection specdec.pivot without copying it:
# .venv/collections/ansible_collections/specdec/pivot -> this checkout (ansible.cfg's collections_path).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .venv/collections/ansible_collections/specdec
ln -sfn "$PWD" .venv/collections/ansible_collections/specdec/pivot
