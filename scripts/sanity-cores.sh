#!/usr/bin/env bash
# ansible-test sanity on the oldest ansible-core that meta/runtime.yml's requires_ansible admits (2.17, Python 3.11)
# and on the newest release (2.21, whose controller needs Python >= 3.12), each from its own venv holding only that
# ansible-core (.venv-core-2.17, .venv-core-2.21: scripts/setup-python.sh, SANITY_CORES). scripts/sanity.sh runs it on
# .venv's ansible-core (2.19). One core after the other, on one copy laid out like scripts/sanity.sh's. A stage of
# scripts/test.sh.
#   --prime-venvs  (scripts/setup-python.sh) only create ansible-test's venv of each sanity test (cached under
#                  ~/.ansible/test/venv, keyed by its requirements), so that the test stage installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/sanity-lib.sh
. scripts/sanity-lib.sh
export PATH="$PWD/.venv/bin:$PATH"
prime=()
if [ "${1:-}" = --prime-venvs ]; then prime=(--prime-venvs); fi

oldest=$(grep -oP '^requires_ansible:\s*"?>=\s*\K[0-9]+\.[0-9]+' meta/runtime.yml)
venvs=(.venv-core-*/)
if [ ! -x ".venv-core-$oldest/bin/ansible-test" ]; then
  echo "sanity-cores: no .venv-core-$oldest (meta/runtime.yml admits ansible-core $oldest): add it to SANITY_CORES in" \
    "scripts/setup-python.sh and run make setup-python (found: ${venvs[*]})" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/specdec/pivot"
sanity_copy "$dest"
for venv in "${venvs[@]}"; do
  venv=$PWD/${venv%/}
  read -r core py < <("$venv/bin/python" -c \
    'import sys, ansible; print(ansible.__version__, "%d.%d" % sys.version_info[:2])')
  printf '\n----- ansible-test sanity %son ansible-core %s, Python %s\n' "${prime[*]/%/ }" "$core" "$py"
  # The venv's ansible-test (its bin first on PATH for what it runs) uses the venv's own Python for --python X.Y, its
  # own version. Its shellcheck test is skipped as in scripts/sanity.sh: scripts/lint.sh runs the pinned ShellCheck.
  (cd "$dest" && PATH="$venv/bin:$PATH" "$venv/bin/ansible-test" sanity --venv --skip-test shellcheck --python "$py" \
     "${prime[@]}")
  rm -rf "$dest/tests/output"
done
