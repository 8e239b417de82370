#!/usr/bin/env bash
# ansible-doc renders every module, the collection builds, and ansible-test sanity passes on a copy of the
# collection laid out under ansible_collections/specdec/pivot (ansible-test needs that real path).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
for m in plugins/modules/*.py; do
  name=$(basename "$m" .py)
  ansible-doc -t module "specdec.pivot.$name" >/dev/null
  echo "ansible-doc specdec.pivot.$name: ok"
done
out=$(mktemp -d)
ansible-galaxy collection build --force --output-path "$out" . >/dev/null
ls "$out"/specdec-pivot-*.tar.gz
rm -rf "$out"

work=$(mktemp -d)
dest="$work/ansible_collections/specdec/pivot"
mkdir -p "$dest"
git ls-files -co --exclude-standard -z | grep -zv '^sglang-ddtree/\|^lab/\|^bench/' | xargs -0 cp --parents -t "$dest"
(cd "$dest" && ansible-test sanity --venv --python "$(python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" \
   --exclude sglang-ddtree/ --exclude lab/ --exclude bench/)
rm -rf "$work"
