# shellcheck shell=bash
# Shared by scripts/sanity.sh and scripts/sanity-cores.sh (sourced, from the checkout's root): the collection copies
# that ansible-galaxy and ansible-test work on.

# copy DEST [grep -v pattern]: the checkout's tracked (and untracked, not ignored) files into DEST
copy() {
  mkdir -p "$1"
  git ls-files -co --exclude-standard -z | { if [ -n "${2:-}" ]; then grep -zv "$2"; else cat; fi; } \
    | while IFS= read -r -d '' f; do if [ -e "$f" ]; then cp --parents "$f" "$1"; fi; done
}

# sanity_copy DEST: the copy ansible-test sanity runs on (DEST ends in ansible_collections/specdec/pivot, the real
# path ansible-test needs). sglang-ddtree/, lab/ and bench/ are not Ansible content: they have their own linters
# and tests.
sanity_copy() { copy "$1" '^sglang-ddtree/\|^lab/\|^bench/'; }
