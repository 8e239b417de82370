"""Tables for plugins/module_utils/_systemd_cmdline.py: systemd's command-line splitting and quoting.

Command lines written here are the test's own inputs.
"""

from __future__ import annotations

import pytest
from ansible_collections.specdec.pivot.plugins.module_utils import _systemd_cmdline as s

# ------------------------------------------------------------------------------------------------------ splitting

SPLIT_CASES = [
    ("/bin/x a b", ["/bin/x", "a", "b"]),
    ('  /bin/x   "a b"  c  ', ["/bin/x", "a b", "c"]),
    ("/bin/x 'a \"b\" c'", ["/bin/x", 'a "b" c']),
    ('/bin/x a"b c"d', ["/bin/x", "ab cd"]),
    (r'/bin/x "a\"b" \\ \x41 \101 \u00e9 \t', ["/bin/x", 'a"b', "\\", "A", "A", "é", "\t"]),
    (r"/bin/x a\sb", ["/bin/x", "a b"]),
    # an unknown escape keeps its backslash and the character (systemd retries with CUNESCAPE_RELAX and warns)
    (r"/bin/x a\ b", ["/bin/x", "a\\ b"]),
    (r"/bin/x \;", ["/bin/x", ";"]),
    ("/bin/x \\\n  --flag \\\n  v", ["/bin/x", "--flag", "v"]),
    ("/bin/x $VAR ${VAR} %n %%", ["/bin/x", "$VAR", "${VAR}", "%n", "%%"]),
    ('/bin/x ""', ["/bin/x", ""]),
    (r"/bin/x \q", ["/bin/x", "\\q"]),
]


@pytest.mark.parametrize(("text", "words"), SPLIT_CASES)
def test_split_command_line(text, words):
    assert s.split_command_line(text) == words


@pytest.mark.parametrize(
    ("text", "match"), [('/bin/x "open', "unterminated"), ("/bin/x 'open", "unterminated"), ("/bin/a ; /bin/b", "';'")]
)
def test_split_errors(text, match):
    with pytest.raises(ValueError, match=match):
        s.split_command_line(text)


@pytest.mark.parametrize(
    ("text", "words"),
    [('A=1 "B=2 C=3', ["A=1"]), ("A=1 B='x", ["A=1"]), ('"A=1', []), ('A=1 "B=2" C=3', ["A=1", "B=2", "C=3"])],
)
def test_split_partial_keeps_the_words_before_an_unterminated_quote(text, words):
    # what systemd keeps of an Environment= line with invalid syntax (it ignores the rest of the line)
    assert s.split_command_line(text, separators=False, partial=True) == words


@pytest.mark.parametrize(
    "word",
    [
        "plain",
        "a b",
        'q"uote',
        "back\\slash",
        "tab\there",
        "new\nline",
        "",
        ";",
        "é",
        "$VAR",
        "%n",
        '{"a": [1, 2]}',
        "it's",
        "\x01",
    ],
)
def test_quote_word_round_trips(word):
    assert s.split_command_line(f"/bin/x {s.quote_word(word)}") == ["/bin/x", word]
