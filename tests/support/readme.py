"""The code blocks of a Markdown file, their test markers, and the commands inside shell blocks.

Pure functions over text (tests/test_readme.py runs and checks what they find).

A block is a fenced code block (```LANG ... ```); its marker is an HTML comment on the lines just
before the opening fence (only blank lines may come between):

    <!-- readme-test: skip (REASON) -->    not run (checked for syntax only); REASON is required
    <!-- readme-test: file PATH -->        the block is the content of PATH (relative to the root)

A block without a marker is run. Invariants: blocks come out in file order with the 1-based line of
their opening fence; a marker belongs to the next fence only; an unknown marker word, a skip
without a reason and a fence left open are errors (ReadmeError), never silently ignored.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

MARKER = re.compile(r"^<!--\s*readme-test:\s*(?P<body>.*?)\s*-->\s*$")
SKIP = re.compile(r"^skip\s*\((?P<reason>.*\S.*)\)$")
FILE = re.compile(r"^file\s+(?P<path>\S+)$")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>```+)\s*(?P<lang>[\w+-]*)\s*$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")

SHELL_LANGS = {"sh", "bash", "shell", "console"}
PYTHON_LANGS = {"python", "py"}
YAML_LANGS = {"yaml", "yml"}
TEXT_LANGS = {"text", "txt"}

# The addresses the README documents (tidemq local's defaults) and what the test puts instead.
DEFAULT_NAMESRV = "127.0.0.1:9876"
DEFAULT_BROKER = "127.0.0.1:10911"
DEFAULT_METRICS = "127.0.0.1:9877"

# Characters of the shell punctuation tokens that end a simple command (shlex with punctuation_chars).
_PUNCTUATION = set(";&|()")
_REDIRECT = re.compile(r"^\d*(>>?|<<?|>&|<&|&>>?)$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class ReadmeError(ValueError):
    """The Markdown breaks the block/marker conventions above."""


@dataclass(frozen=True, slots=True)
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    section: str  # the nearest heading above the block
    skip: str | None = None  # the reason, when marked skip
    file: str | None = None  # the path, when marked file

    @property
    def kind(self) -> str:
        """shell, python, yaml, text, or the unknown language itself."""
        for kind, langs in (("shell", SHELL_LANGS), ("python", PYTHON_LANGS), ("yaml", YAML_LANGS),
                            ("text", TEXT_LANGS)):
            if self.lang in langs:
                return kind
        return self.lang or "(none)"

    @property
    def runs(self) -> bool:
        return self.skip is None and self.file is None and self.kind in ("shell", "python")



def block_ids(found: list[Block]) -> list[str]:
    """Test ids that survive edits elsewhere in the file: kind, section, and the block's number
    among the blocks of that kind in that section (``shell-admin-mqadmin-s-flag-letters-1``)."""
    seen: dict[tuple[str, str], int] = {}
    ids = []
    for b in found:
        slug = re.sub(r"[^a-z0-9]+", "-", b.section.lower()).strip("-")[:40].strip("-") or "top"
        n = seen[(b.kind, slug)] = seen.get((b.kind, slug), 0) + 1
        ids.append(f"{b.kind}-{slug}-{n}")
    return ids


def _marker(body: str, line: int) -> tuple[str | None, str | None]:
    if m := SKIP.match(body):
        return m["reason"].strip(), None
    if m := FILE.match(body):
        return None, m["path"]
    raise ReadmeError(f"line {line}: unknown readme-test marker {body!r}: use "
                      "'skip (REASON)' or 'file PATH'")


def blocks(markdown: str) -> list[Block]:
    """Every fenced code block of ``markdown``, in order, with its marker."""
    out: list[Block] = []
    lines = markdown.splitlines()
    section = ""
    pending: tuple[int, str] | None = None  # (line, marker body) waiting for its fence
    i = 0
    while i < len(lines):
        line = lines[i]
        if (m := MARKER.match(line.strip())) is not None:
            if pending is not None:
                raise ReadmeError(f"line {pending[0]}: readme-test marker not followed by a code block")
            pending = (i + 1, m["body"])
        elif (f := FENCE.match(line)) is not None:
            start, body = i, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(f["fence"]):
                body.append(lines[i][len(f["indent"]):] if lines[i].startswith(f["indent"]) else lines[i])
                i += 1
            if i == len(lines):
                raise ReadmeError(f"line {start + 1}: code block never closed")
            skip = path = None
            if pending is not None:
                skip, path = _marker(pending[1], pending[0])
                pending = None
            out.append(Block(start + 1, f["lang"].lower(), "\n".join(body) + "\n", section, skip, path))
        elif (h := HEADING.match(line)) is not None:
            section = h[2]
            if pending is not None:
                raise ReadmeError(f"line {pending[0]}: readme-test marker not followed by a code block")
        elif line.strip() and pending is not None:
            raise ReadmeError(f"line {pending[0]}: readme-test marker must sit right before its code "
                              f"block (only blank lines between), found text on line {i + 1}")
        i += 1
    if pending is not None:
        raise ReadmeError(f"line {pending[0]}: readme-test marker not followed by a code block")
    return out


def indented_code_lines(markdown: str) -> list[int]:
    """Lines that open an indented (4-space) code block outside fences and lists: the test can
    neither mark nor run those, so commands must be fenced."""
    found = []
    in_fence = False
    prev_blank = True
    in_list = False
    for n, line in enumerate(markdown.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            stripped = line.lstrip()
            if re.match(r"^([-*+]|\d+\.)\s", stripped) and len(line) - len(stripped) < 4:
                in_list = True
            elif not line.strip():
                pass
            elif len(line) - len(stripped) == 0:
                in_list = False
            if line.startswith("    ") and line.strip() and prev_blank and not in_list:
                found.append(n)
        prev_blank = not line.strip()
    return found


def substitute(text: str, namesrv: str, broker: str, metrics: str) -> str:
    """The block with the documented default addresses replaced by the test's (a port followed by
    another digit is a different port and stays)."""
    for default, actual in ((DEFAULT_NAMESRV, namesrv), (DEFAULT_BROKER, broker), (DEFAULT_METRICS, metrics)):
        text = re.sub(re.escape(default) + r"(?!\d)", actual, text)
    return text


def shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script as argument lists: comments, line continuations,
    ``VAR=value`` prefixes and redirections removed, split at ``;``, ``&&``, ``||``, ``|``, ``&`` and
    parentheses (so a ``$(...)`` substitution is a command of its own). Words stay as written
    (no expansion). Heredoc bodies are not supported (ReadmeError)."""
    if "<<" in script:
        raise ReadmeError("heredocs in README shell blocks are not understood by the command check")
    commands: list[list[str]] = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        tokens = list(lexer)
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if set(tok) <= _PUNCTUATION:
                if current:
                    commands.append(current)
                current = []
            elif _REDIRECT.match(tok):
                if current and current[-1].isdigit():  # `2>&1`: the descriptor number went in as a word
                    current.pop()
                i += 1  # the redirection's target
            elif not current and _ASSIGNMENT.match(tok):
                pass  # VAR=value before a command, or an assignment on its own
            else:
                current.append(tok)
            i += 1
        if current:
            commands.append(current)
    return commands
