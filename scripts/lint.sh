#!/usr/bin/env bash
# The linters, each from the project's pinned environments by its path, whatever else is on PATH (a machine's
# own ShellCheck, ruff or ansible-lint is never used): ruff and yamllint from .venv (requirements/dev.txt),
# ShellCheck and ansible-lint from .venv-lint (requirements/lint.txt); both made by scripts/setup-python.sh.
# A stage of scripts/test.sh. Usage: scripts/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=$root/.venv/bin lint=$root/.venv-lint/bin
for tool in "$venv/ruff" "$venv/yamllint" "$lint/shellcheck" "$lint/ansible-lint"; do
  [ -x "$tool" ] || { echo "lint.sh: $tool is missing: run make setup-python" >&2; exit 1; }
done

echo "ruff $("$venv/ruff" --version | cut -d' ' -f2) ($venv/ruff)"
"$venv/ruff" check plugins tests sglang-ddtree lab bench roles scripts

echo "yamllint $("$venv/yamllint" --version | cut -d' ' -f2) ($venv/yamllint)"
"$venv/yamllint" -s .

# Every shell script of the checkout (tracked, and untracked not ignored): *.sh and files with a sh/bash shebang.
# sglang-ddtree/ belongs to its own package and is left to its owner's linters; bench/ (the GPU-machine scripts
# under bench/gpu/ included) is checked.
echo "shellcheck $("$lint/shellcheck" --version | sed -n 's/^version: //p') ($lint/shellcheck)"
mapfile -t shell_scripts < <(git ls-files -co --exclude-standard | grep -v '^sglang-ddtree/' \
  | while IFS= read -r f; do
  [ -f "$f" ] || continue
  case "$f" in *.sh) echo "$f" ;; *) head -c 64 "$f" 2>/dev/null | grep -qE '^#!(/usr/bin/env |/bin/)(ba)?sh' && echo "$f" ;; esac
done)
"$lint/shellcheck" -x "${shell_scripts[@]}"
echo "shellcheck: ${#shell_scripts[@]} scripts clean"

# ansible-lint, production profile, on the roles, playbooks and molecule scenarios (.ansible-lint says what is
# excluded and why), with its own venv's ansible first on PATH for the ansible commands it runs.
echo "ansible-lint $("$lint/python" -c 'import importlib.metadata as m; print(m.version("ansible-lint"))') ($lint/ansible-lint)"
PATH="$lint:$PATH" "$lint/ansible-lint" --offline --nocolor roles playbooks molecule
echo "ansible-lint (production profile): clean"
