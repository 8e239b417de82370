# Private module_utils for specdec.pivot: which values of an SGLang unit are secrets, and masking them.
"""Secrets in an SGLang unit: API keys on the command line, every non-harmless environment value (issue 25).

The one policy the modules (``sglang_capabilities``, ``sglang_server_args``) and the controller's filters
(``pivot_secrets``, ``pivot_mask``, ``pivot_unmask``) share:

- The value of ``--api-key`` and ``--admin-api-key`` (:data:`SECRET_FLAGS`) is a secret, however SGLang's argparse
  reads the flag: ``--api-key K``, ``--api-key=K``, and any abbreviation argparse accepts (``--api-ke K``,
  ``--admin=K``; :func:`secret_flag`). Without the server's full flag list every prefix of a secret flag is taken
  for that flag: an abbreviation that is in fact ambiguous makes the server refuse to start, so masking its value
  costs nothing.
- Every ``Environment=``, ``EnvironmentFile=`` and ``env NAME=value`` value is a secret unless its NAME is harmless
  (:func:`harmless_env_name`: :data:`HARMLESS_ENV_NAMES`, or a :data:`HARMLESS_ENV_PREFIXES` name that holds none of
  :data:`_SECRET_WORD_RE`'s words), or the value itself carries nothing (:func:`harmless_value`: empty, a boolean
  word, a number of at most 5 characters, a bare ``$VAR`` reference, an absolute path). Names are never secret;
  values are.
- :func:`mask` replaces each secret value by a named marker ``{secret:NAME}`` (``NAME`` is the flag or the variable),
  so the controller can put the real values back (:func:`unmask`) where the unit is re-written, and shows ``***``
  (:data:`MASK`) everywhere else. A key (a flag's value) is replaced wherever it occurs; an environment value where
  it is a whole string (a dict value, an argv word) or follows its ``NAME=``, never inside other text: such values
  are often ordinary words or paths (``MODEL=Qwen3``) that other fields (the model path, the interpreter) contain.

Pure functions; keeps to Python 3.8 syntax with ``from __future__ import annotations``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: SGLang's flags whose value is a secret.
SECRET_FLAGS = ("--api-key", "--admin-api-key")

#: Environment names whose values are harmless (never masked): paths, locales, thread counts, device selection.
HARMLESS_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONFAULTHANDLER",
        "PYTHONWARNINGS",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "LD_LIBRARY_PATH",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "HF_HUB_ENABLE_HF_TRANSFER",
        "TRANSFORMERS_OFFLINE",
        "TRANSFORMERS_CACHE",
        "XDG_CACHE_HOME",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "PYTORCH_CUDA_ALLOC_CONF",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
    }
)
#: Name prefixes of settings (device selection, NCCL/CUDA/torch/SGLang tuning) whose values are harmless, unless
#: the name holds a secret-sounding word (``SGLANG_API_KEY``, ``NCCL_..._TOKEN`` stay secret).
HARMLESS_ENV_PREFIXES = ("LC_", "CUDA_", "NCCL_", "SGLANG_", "TORCH_", "OMP_", "MKL_")
_SECRET_WORD_RE = re.compile(r"KEY|TOKEN|SECRET|PASS|PWD|AUTH|CRED|DSN|CERT|PRIVATE|SIGN|SESSION|COOKIE|UR[LI]", re.I)
_HARMLESS_VALUE_RE = re.compile(r"^(?:true|false|yes|no|on|off|[-+]?[0-9.]{1,5}|\$\{?\w+\}?|/[^\s@]*)$", re.I)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: What a secret looks like where it is shown (plan, --diff, report, console).
MASK = "***"
_MARKER_RE = re.compile(r"\{secret:([^{}\s]+)\}")


def marker(name: str) -> str:
    """The placeholder a secret value is replaced with in a module's result: ``{secret:--api-key}``."""
    return "{secret:" + name + "}"


def valid_env_name(name: object) -> bool:
    """Whether ``name`` can be an environment variable's name (systemd and execve accept it)."""
    return isinstance(name, str) and bool(_ENV_NAME_RE.match(name))


def harmless_env_name(name: str) -> bool:
    """Whether an environment variable's value is shown in clear (see the module's docstring)."""
    name = str(name)
    if name in HARMLESS_ENV_NAMES:
        return True
    return name.startswith(HARMLESS_ENV_PREFIXES) and not _SECRET_WORD_RE.search(name)


def harmless_value(value: str) -> bool:
    """An environment value that carries no secret: empty, a boolean word, a short number, a bare ``$VAR``, an
    absolute path (or a ``:`` list of them, without ``@``)."""
    return not value or bool(_HARMLESS_VALUE_RE.match(value))


def secret_flag(word: str) -> str | None:
    """The secret flag ``word`` (``--api-ke`` or ``--api-key=K``: the part before ``=``) stands for, else None.

    argparse (``allow_abbrev``, SGLang's default) takes any unambiguous prefix of a long option for it; a prefix of
    both secret flags cannot be one (``--a``), and such a word's value is still a secret for either.
    """
    flag = str(word).split("=", 1)[0]
    if not flag.startswith("--") or len(flag) < 3:
        return None
    for name in SECRET_FLAGS:
        if name.startswith(flag):
            return name
    return None


def flag_secrets(argv: list[str]) -> list[tuple[str, str]]:
    """``(flag, value)`` of every secret flag in ``argv`` (``--flag value``, ``--flag=value``, abbreviations)."""
    words = [str(w) for w in argv or []]
    found: list[tuple[str, str]] = []
    for i, word in enumerate(words):
        if word == "--":
            break
        name = secret_flag(word)
        if not name:
            continue
        if "=" in word:
            found.append((name, word.split("=", 1)[1]))
        elif i + 1 < len(words) and not (words[i + 1].startswith("--") and len(words[i + 1]) > 2):
            found.append((name, words[i + 1]))
    return found


def unit_secrets(argv: list[str], *environments: Mapping | None) -> dict[str, str]:
    """``{name: value}`` of every secret of a unit: its secret flags' values, then its environment values.

    ``environments``: the ``Environment=`` values, the ``EnvironmentFile=`` values, the ``env NAME=value`` words,
    in that order. A name seen again with another value gets ``#2``, ``#3`` (both values are secrets). A bare
    ``$VAR`` flag value is not a secret (the variable's value is, where it is one).
    """
    found: dict[str, str] = {}

    def add(name: str, value: str) -> None:
        if value in found.values():
            return
        key, n = name, 1
        while key in found:
            n += 1
            key = f"{name}#{n}"
        found[key] = value

    for name, value in flag_secrets(argv):
        if value and not re.match(r"^\$\{?\w+\}?$", value):
            add(name, value)
    for env in environments:
        for name, value in (env or {}).items():
            value = "" if value is None else str(value)
            if not harmless_env_name(name) and not harmless_value(value):
                add(str(name), value)
    return found


def is_key(name: str) -> bool:
    """Whether a secret's name is a flag's (an API key: replaced wherever it occurs), not a variable's."""
    return name.startswith("--")


def _pattern(secrets: Mapping[str, str]):
    """One regex for every secret, longest first, so one pass replaces them all and a marker put in for one value is
    never searched for another. A key matches anywhere (under 4 characters only as a whole word); an environment
    value only after its ``NAME=`` (the value alone is matched by :func:`mask` as a whole string)."""
    parts: list[tuple[int, str]] = []
    for name, value in secrets.items():
        if is_key(name):
            exp = re.escape(value) if len(value) >= 4 else r"(?<![\w-])" + re.escape(value) + r"(?![\w-])"
        else:
            exp = r"(?<![\w])" + re.escape(name.split("#", 1)[0] + "=") + "(?P<v" + str(len(parts)) + ">"
            exp += re.escape(value) + r")(?![^\s\"',;}])"
        parts.append((len(value), exp))
    return re.compile("|".join(part[1] for part in sorted(parts, key=lambda p: -p[0])))


def map_strings(data, fn):
    """``data`` (str, list, tuple, dict, nested) with ``fn`` applied to every string in it, dict keys included;
    other values as they are. Lists and tuples come back as lists."""
    if isinstance(data, str):
        return fn(data)
    if isinstance(data, Mapping):
        return {map_strings(k, fn) if isinstance(k, str) else k: map_strings(v, fn) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [map_strings(v, fn) for v in data]
    return data


def mask(data, secrets: Mapping[str, str], named: bool = True):
    """``data`` (str, list, dict, nested) with every secret value replaced: by its marker (``named``) or ``***``.

    A string equal to a secret is replaced whole. Inside a longer string, a key (:func:`is_key`) is replaced
    wherever it occurs (under 4 characters only as a whole word), an environment value only where it follows its
    ``NAME=`` (``env HF_TOKEN=K3``, ``Environment=HF_TOKEN=K3``). Dict keys are masked too.
    """
    secrets = {k: str(v) for k, v in (secrets or {}).items() if v not in (None, "")}
    if not secrets:
        return data
    exact = {v: k for k, v in secrets.items()}
    by_group = {f"v{i}": k for i, k in enumerate(secrets) if not is_key(k)}
    keys = {v: k for k, v in secrets.items() if is_key(k)}
    pattern = _pattern(secrets)

    def sub(m) -> str:
        group = next((g for g, v in m.groupdict().items() if v is not None), None)
        if group is None:
            return marker(keys[m.group(0)]) if named else MASK
        name = by_group[group]
        head = m.group(0)[: m.start(group) - m.start(0)]
        return head + (marker(name) if named else MASK)

    def one(text: str) -> str:
        if text in exact:
            return marker(exact[text]) if named else MASK
        return pattern.sub(sub, text)

    return map_strings(data, one)


def unmask(data, secrets: Mapping[str, str]):
    """``data`` with every ``{secret:NAME}`` marker replaced by ``secrets[NAME]`` (the inverse of :func:`mask`).

    Raises KeyError naming the first marker without a value (the caller says where the value should come from).
    """

    def one(text: str) -> str:
        def sub(m):
            if m.group(1) not in secrets:
                raise KeyError(m.group(1))
            return str(secrets[m.group(1)])

        return _MARKER_RE.sub(sub, text)

    return map_strings(data, one)


def markers(data) -> list[str]:
    """The names of the ``{secret:NAME}`` markers in ``data`` (str, list, dict, nested), in order, once each."""
    out: list[str] = []

    def walk(item):
        if isinstance(item, str):
            out.extend(n for n in _MARKER_RE.findall(item) if n not in out)
        elif isinstance(item, Mapping):
            for k, v in item.items():
                walk(k)
                walk(v)
        elif isinstance(item, (list, tuple)):
            for v in item:
                walk(v)

    walk(data)
    return out
