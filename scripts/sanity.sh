#!/usr/bin/env bash
# ansible-doc renders every module; the collection builds; ansible-test sanity passes. Both work on copies of
# the tracked (and untracked, not ignored) files laid out under ansible_collections/specdec/pivot, the real
# path ansible-test needs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=scripts/sanity-lib.sh
. scripts/sanity-lib.sh

for m in plugins/modules/*.py; do
  [ -e "$m" ] || continue
  name=$(basename "$m" .py)
  ansible-doc -t module "specdec.pivot.$name" >/dev/null
  echo "ansible-doc specdec.pivot.$name: ok"
done

# ShellCheck on the collection's and the lab's shell scripts (ansible-test's own shellcheck test sees only the
# collection's part, and skips silently where shellcheck is missing): need_shellcheck installs it from PyPI when
# the machine has none. bench/ and sglang-ddtree/ belong to their own packages and are left to their owners' linters.
need_shellcheck
mapfile -t shell_scripts < <(git ls-files -co --exclude-standard | grep -v '^bench/\|^sglang-ddtree/' \
  | while IFS= read -r f; do
  [ -f "$f" ] || continue
  case "$f" in *.sh) echo "$f" ;; *) head -c 64 "$f" 2>/dev/null | grep -qE '^#!(/usr/bin/env |/bin/)(ba)?sh' && echo "$f" ;; esac
done)
shellcheck -x "${shell_scripts[@]}"
echo "shellcheck: ${#shell_scripts[@]} scripts clean"

# ansible-lint, production profile, on the roles, playbooks and molecule scenarios (.ansible-lint says what is
# excluded and why), from its own venv so its pins never move the collection's ansible-core.
if [ ! -x .venv-lint/bin/ansible-lint ]; then
  python3 -m venv .venv-lint
  .venv-lint/bin/pip install -q 'ansible-lint==26.10.1' 'ansible==12.3.0'
fi
.venv-lint/bin/ansible-lint --offline --nocolor roles playbooks molecule
echo "ansible-lint (production profile): clean"

copy "$work/build/ansible_collections/specdec/pivot"
ansible-galaxy collection build --force --output-path "$work" "$work/build/ansible_collections/specdec/pivot" >/dev/null
ls "$work"/specdec-pivot-*.tar.gz

dest="$work/sanity/ansible_collections/specdec/pivot"
sanity_copy "$dest"
# Each sanity test gets its own venv with ansible-test's pinned tools (pip bootstrap: scripts/setup-python.sh).
(cd "$dest" && ansible-test sanity --venv \
   --python "$(python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')")
