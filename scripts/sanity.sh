#!/usr/bin/env bash
# ansible-doc renders every module; the collection builds; ansible-test sanity passes (all from .venv's ansible-core).
# Both work on copies of the tracked (and untracked, not ignored) files laid out under
# ansible_collections/specdec/pivot, the real path ansible-test needs. (ShellCheck and ansible-lint: scripts/lint.sh.)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/.venv/bin
export PATH="$bin:$PATH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=scripts/sanity-lib.sh
. scripts/sanity-lib.sh

for m in plugins/modules/*.py; do
  [ -e "$m" ] || continue
  name=$(basename "$m" .py)
  "$bin/ansible-doc" -t module "specdec.pivot.$name" >/dev/null
  echo "ansible-doc specdec.pivot.$name: ok"
done

copy "$work/build/ansible_collections/specdec/pivot"
"$bin/ansible-galaxy" collection build --force --output-path "$work" "$work/build/ansible_collections/specdec/pivot" \
  >/dev/null
ls "$work"/specdec-pivot-*.tar.gz

dest="$work/sanity/ansible_collections/specdec/pivot"
sanity_copy "$dest"
# Each sanity test gets its own venv with ansible-test's pinned tools (pip bootstrap: scripts/setup-python.sh).
# ansible-test's shellcheck test is skipped: it would run whatever shellcheck is on PATH, and scripts/lint.sh runs the
# pinned ShellCheck on every shell script, the collection's included, with no codes excluded.
(cd "$dest" && "$bin/ansible-test" sanity --venv --skip-test shellcheck \
   --python "$("$bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')")
