#!/usr/bin/env bash
# ansible-doc renders every module; the collection builds; ansible-test sanity passes. Both work on copies of
# the tracked (and untracked, not ignored) files laid out under ansible_collections/specdec/pivot, the real
# path ansible-test needs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for m in $(ls plugins/modules/*.py 2>/dev/null); do
  name=$(basename "$m" .py)
  ansible-doc -t module "specdec.pivot.$name" >/dev/null
  echo "ansible-doc specdec.pivot.$name: ok"
done

copy() {  # copy DEST [grep -v pattern]: the checkout's files into DEST
  mkdir -p "$1"
  git ls-files -co --exclude-standard -z | { if [ -n "${2:-}" ]; then grep -zv "$2"; else cat; fi; } \
    | xargs -0 -I{} sh -c '[ -e "{}" ] && cp --parents "{}" "$0"' "$1"
}

copy "$work/build/ansible_collections/specdec/pivot"
ansible-galaxy collection build --force --output-path "$work" "$work/build/ansible_collections/specdec/pivot" >/dev/null
ls "$work"/specdec-pivot-*.tar.gz

# sglang-ddtree/, lab/ and bench/ are not Ansible content: they have their own linters and tests.
dest="$work/sanity/ansible_collections/specdec/pivot"
copy "$dest" '^sglang-ddtree/\|^lab/\|^bench/'
# Each sanity test gets its own venv with ansible-test's pinned tools (pip bootstrap: scripts/setup-python.sh).
(cd "$dest" && ansible-test sanity --venv \
   --python "$(python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')")
