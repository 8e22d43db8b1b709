"""The project's shell scripts: no pipe under `pipefail` ends in a reader that quits early.

With `set -o pipefail` a pipe fails when any of its commands does. A reader that stops before
its input ends (`head`, `grep -q`, `grep -m N`, `sed q`, `awk '{... exit}'`, `read`, `true`)
closes the pipe; a writer still writing then dies of SIGPIPE (exit 141, or 255 for some
programs), and under `set -e` the step fails at random: scripts/compose_smoke.sh failed about
1 run in 5 per such pipe. The fix is a reader that consumes its whole input (`sed -n 1p`,
`grep -c`, `grep ... >/dev/null`, `tail -n 1`) or no pipe at all (read the output into a
variable and test that).

The scan covers every tracked shell script (a `.sh` file, a `sh`/`bash` shebang, .ci/run) and
every Makefile or Dockerfile whose shell sets pipefail; it joins continued lines, skips comments
and here-documents, and reports each offending pipe as file:line.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_SHEBANG = re.compile(r"^#!.*\b(?:ba|da|k|z)?sh\b")
_PIPEFAIL = re.compile(r"\bpipefail\b")
# A pipe: one `|` (or `|&`), not `||`.
_PIPE = re.compile(r"(?<!\|)\|&?(?!\|)")
# The end of the reader's simple command.
_COMMAND_END = re.compile(r"[;&|)}`]")
# Words before the reader's own name that run it unchanged.
_PREFIXES = {"(", "{", "!", "command", "exec", "builtin", "nice", "nohup", "stdbuf", "env", "timeout"}
_HEREDOC = re.compile(r"(?<!<)<<-?(?!<)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
# grep's options that make it stop at the first match (or after N).
_GREP_LONG = ("--quiet", "--silent", "--max-count", "--files-with-matches", "--files-without-match")
_GREP_ARG_OPTS = set("efmABCdD")
_SED_QUIT = re.compile(r"(?:^|[\s;{}0-9$/])[qQ]\s*[0-9]*\s*(?:$|[;}])")


def shell_files(root: Path = REPO) -> list[Path]:
    """Tracked files that hold shell code: scripts, and Makefiles/Dockerfiles (their recipes)."""
    if not (shutil.which("git") and (root / ".git").exists()):
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True)
    out = []
    for rel in filter(None, listed.stdout.split("\0")):
        path = root / rel
        if not path.is_file() or path.suffix in (".py", ".md", ".json", ".csv", ".txt", ".toml", ".yml", ".yaml"):
            continue
        name = path.name
        if path.suffix == ".sh" or rel == ".ci/run" or name in ("Makefile", "GNUmakefile") or name.endswith(".mk") \
                or name.startswith("Dockerfile"):
            out.append(path)
            continue
        try:
            with path.open("rb") as fh:
                first = fh.readline(200).decode("utf-8", "replace")
        except OSError:
            continue
        if _SHEBANG.match(first):
            out.append(path)
    return out


def sets_pipefail(text: str) -> bool:
    """`set -o pipefail`, `set -euo pipefail`, `SHELL := bash -o pipefail`, `.SHELLFLAGS` or a
    Dockerfile's `SHELL [..., "-o", "pipefail", ...]`: any non-comment mention turns the scan on."""
    return any(_PIPEFAIL.search(strip_comment(line)) for line in text.splitlines())


def _cut_unquoted(text: str, ends_here: Callable[[str, int], bool]) -> str:
    """`text` up to the first position outside quotes (and not escaped) where `ends_here(text, i)`."""
    quote, i = "", 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = ""
        elif ch == "\\":
            i += 1
        elif ch in "'\"":
            quote = ch
        elif ends_here(text, i):
            return text[:i]
        i += 1
    return text


def strip_comment(line: str) -> str:
    """The line without a `#` comment (a `#` at the start or after a blank, outside quotes)."""
    return _cut_unquoted(line, lambda t, i: t[i] == "#" and (i == 0 or t[i - 1] in " \t;"))


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with backslash continuations and trailing `|` joined, comments
    dropped and here-document bodies skipped."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines()
    i, buf, start, heredocs = 0, "", 0, []
    while i < len(lines):
        line = lines[i]
        i += 1
        if heredocs:
            if line.strip() == heredocs[0]:
                heredocs.pop(0)
            continue
        code = strip_comment(line)
        if not buf:
            start = i
        heredocs += [m.group(2) for m in _HEREDOC.finditer(code)]
        stripped = code.rstrip()
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        if re.search(r"(?<!\|)\|&?$", stripped) and not heredocs:  # a pipe that goes on below
            buf += stripped + " "
            continue
        out.append((start, buf + code))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def _words(segment: str) -> list[str]:
    try:
        return shlex.split(segment)
    except ValueError:
        return segment.split()


def first_command(segment: str) -> str:
    """The text of the simple command at the start of `segment`: up to the first `;`, `&&`, `||`,
    `|`, `&`, `)`, `}` or backquote outside quotes."""
    return _cut_unquoted(segment, lambda t, i: _COMMAND_END.match(t, i) is not None)


def early_reader(segment: str) -> str | None:
    """What is wrong with the reader at the start of `segment` (the text after a `|`), or None."""
    words = _words(first_command(segment.lstrip(" \t({!")))
    while words and (words[0] in _PREFIXES or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0])):
        head = words.pop(0)
        if head == "timeout" and words:
            while words and words[0].startswith("-"):
                words.pop(0)
            if words:
                words.pop(0)  # the duration
        elif head == "nice" and words[:1] == ["-n"]:
            del words[:2]
        elif head in ("nice", "stdbuf", "env"):
            while words and words[0].startswith("-"):
                words.pop(0)
    if not words:
        return None
    name, args = Path(words[0]).name, words[1:]
    if name == "head":
        return "head stops reading after its lines"
    if name in ("true", ":", "false"):
        return f"`{name}` reads nothing"
    if name == "read":
        return "read takes one line and stops"
    if name in ("grep", "egrep", "fgrep", "zgrep", "rg"):
        for arg in args:
            if arg == "--":
                break
            if arg.startswith("--"):
                if arg.split("=", 1)[0] in _GREP_LONG:
                    return f"grep {arg} stops at the first match"
            elif arg.startswith("-") and len(arg) > 1:
                for ch in arg[1:]:
                    if ch in "qlLm":
                        return f"grep {arg} stops at the first match"
                    if ch in _GREP_ARG_OPTS:
                        break
        return None
    if name in ("sed", "gsed"):
        scripts, it = [], iter(args)
        for arg in it:
            if arg in ("-e", "--expression"):
                scripts.append(next(it, ""))
            elif arg.startswith("--expression="):
                scripts.append(arg.split("=", 1)[1])
            elif arg.startswith("-"):
                continue
            else:
                scripts.append(arg)
                if not any(a in ("-e", "--expression") for a in args):
                    break  # the first operand is the script; the rest are files
        if any(_SED_QUIT.search(s) for s in scripts):
            return "sed's q command stops reading"
        return None
    if name in ("awk", "gawk", "mawk", "nawk"):
        program = next((a for a in args if not a.startswith("-")), "")
        if re.search(r"\bexit\b", program):
            return "awk's exit stops reading"
    return None


def find_early_readers(path: Path) -> list[str]:
    """file:line: problem, for every pipe in `path` into a reader that may quit before its input ends."""
    text = path.read_text(errors="replace")
    if not sets_pipefail(text):
        return []
    try:
        rel = path.relative_to(REPO)
    except ValueError:
        rel = path
    found = []
    for lineno, line in logical_lines(text):
        for m in _PIPE.finditer(line):
            problem = early_reader(line[m.end():])
            if problem:
                found.append(f"{rel}:{lineno}: {problem}: {line.strip()}")
    return found


# ----------------------------------------------------------------------------- the project's scripts
def test_the_scan_sees_the_projects_pipefail_scripts():
    files = {str(p.relative_to(REPO)) for p in shell_files()}
    assert {"scripts/compose_smoke.sh", "scripts/wheelhouse.sh", ".ci/run", "Makefile", "Dockerfile"} <= files
    scanned = {f for f in files if sets_pipefail((REPO / f).read_text(errors="replace"))}
    assert {"scripts/compose_smoke.sh", "scripts/wheelhouse.sh", ".ci/run"} <= scanned


def test_no_pipefail_script_pipes_into_a_reader_that_quits_early():
    found = [hit for path in shell_files() for hit in find_early_readers(path)]
    assert not found, (
        "under pipefail these pipes fail at random when the reader quits first (the writer dies of "
        "SIGPIPE); use a reader that reads everything (sed -n 1p, grep -c, grep >/dev/null) or a "
        "variable:\n  " + "\n  ".join(found))


# ----------------------------------------------------------------------------- the check itself
PLANTED = """#!/usr/bin/env bash
set -euo pipefail
v="$(docker compose ps -q worker | head -n 1)"
docker inspect "$v" | grep -qF "$secret" || exit 1
docker info | grep -Eq 'Storage Driver: vfs'
journalctl | grep -m1 error
first=$(some_command | sed q)
first=$(some_command | sed -n '1p;q')
some_command \\
    | head -c 10
some_command |
    grep --quiet ready
ps aux |& grep -l foo
ls | awk 'NR == 1 { print; exit }'
yes | true
printf 'a\\nb\\n' | { read -r x; }
timeout 5 cat /dev/zero | timeout 5 head -c 1
"""

SAFE = """#!/usr/bin/env bash
set -euo pipefail
# a comment: ps | head -n 1
v="$(docker compose ps -q worker | sed -n 1p)"
n="$(docker inspect x | grep -cF secret)"
docker info | grep -E 'vfs' >/dev/null
last="$(ray status | tail -n 1)"
state="$(compose ps | sort | tr '\\n' ' ')"
grep -q foo file.txt || echo "missing"
[ -s file ] || { echo no; exit 1; }
x="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')"
python3 - <<'PY'
import sys
print(sorted(a | b for a, b in [(1, 2)]))  # | head -n 1 in a here-document is Python
PY
sed 's/^/    /' log.txt | sed -n '/done/p'
case "$x" in a|b) : ;; esac
"""


def test_the_check_names_every_planted_early_reader(tmp_path):
    script = tmp_path / "planted.sh"
    script.write_text(PLANTED)
    found = find_early_readers(script)
    lines = [int(hit.split(":")[1]) for hit in found]
    assert lines == [3, 4, 5, 6, 7, 8, 9, 11, 13, 14, 15, 16, 17], "\n".join(found)
    assert found[0].startswith(f"{script}:3: head stops reading"), found[0]
    assert "grep -qF stops at the first match" in found[1]
    assert "sed's q command" in found[4]


def test_the_check_passes_readers_that_consume_their_input(tmp_path):
    script = tmp_path / "safe.sh"
    script.write_text(SAFE)
    assert find_early_readers(script) == []


def test_scripts_without_pipefail_are_not_scanned(tmp_path):
    script = tmp_path / "plain.sh"
    script.write_text(PLANTED.replace("set -euo pipefail", "set -eu"))
    assert find_early_readers(script) == []
    make = tmp_path / "Makefile"
    make.write_text("SHELL := bash\n.SHELLFLAGS := -eu -o pipefail -c\nall:\n\tls | head -n 1\n")
    assert [h.split(":")[1] for h in find_early_readers(make)] == ["4"]


def test_the_check_catches_a_pipe_planted_in_a_real_script(tmp_path):
    """The project's smoke script, with one line of the old kind put back, fails the scan there."""
    text = (REPO / "scripts" / "compose_smoke.sh").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(text) if line.startswith("run_study_killing_a_worker()")) + 1
    text.insert(at, '    victim="$(compose ps -q ray-worker | head -n 1)"\n')
    planted = tmp_path / "compose_smoke.sh"
    planted.write_text("".join(text))
    assert [h.split(":")[1] for h in find_early_readers(planted)] == [str(at + 1)]


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck is not installed")
def test_shellcheck_passes_on_the_shell_scripts():
    res = subprocess.run(["shellcheck", "-x", "scripts/compose_smoke.sh", "scripts/wheelhouse.sh",
                          "docker/postgres/entrypoint.sh", ".ci/run", "bench/parts.sh", "bench/truths/truths.sh",
                          "bench/frontier/frontier.sh"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
