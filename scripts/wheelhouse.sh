#!/usr/bin/env bash
# Fill ./wheelhouse with every wheel the image needs, for an image build without PyPI (an
# air-gapped node, or a build that cannot reach an index). Run it where PyPI is reachable, with
# the image's Python (3.11) on the image's CPU architecture.
#
#   scripts/wheelhouse.sh                        # torch==2.13.0 (pip's choice of build)
#   TORCH_SPEC="torch==2.13.0" PIP_EXTRA="--extra-index-url https://download.pytorch.org/whl/cu126" \
#       scripts/wheelhouse.sh                    # another torch build
#
# The dependency list is read from pyproject.toml, the one place it is written; torch is pinned
# to TORCH_SPEC (a bare range would let pip pick a multi-GB CUDA build).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
command -v "$PYTHON" >/dev/null || { echo "$PYTHON not found: set PYTHON to a Python 3.11 interpreter." >&2; exit 2; }

reqs="$(mktemp)"
trap 'rm -f "$reqs"' EXIT
"$PYTHON" -c "import sys, tomllib; deps = tomllib.load(open(sys.argv[1], 'rb'))['project']['dependencies']; print(*deps, sep=chr(10))" \
    "$REPO/pyproject.toml" | sed -E "s/^torch([<>=!~ ;[].*)?$/${TORCH_SPEC}/" > "$reqs"
# shellcheck disable=SC2086  # PIP_EXTRA holds several pip arguments
"$PYTHON" -m pip download --dest "$REPO/wheelhouse" --only-binary=:all: ${PIP_EXTRA:-} \
    setuptools wheel -r "$reqs"
echo "wheelhouse: $(find "$REPO/wheelhouse" -name '*.whl' | wc -l) wheels, $(du -sh "$REPO/wheelhouse" | cut -f1)"
