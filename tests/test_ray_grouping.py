"""`make test`'s `-n 2 --dist loadgroup` puts every Ray test on one xdist worker (tests/conftest.py):
two Ray clusters on a 2-core machine compete for its cores, and the grouping mark has to be added
before xdist reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def test_every_ray_test_runs_on_one_xdist_worker(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(f"""
import importlib.util
spec = importlib.util.spec_from_file_location("archhpo_tests_conftest", {str(CONFTEST)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
pytest_collection_modifyitems = module.pytest_collection_modifyitems  # the hook, with its tryfirst
""")
    pytester.makeini("[pytest]\nmarkers =\n    ray: starts Ray\n")
    tests = "\n".join(f"""
@pytest.mark.ray
def test_ray_{i}():
    with open("workers.txt", "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
""" for i in range(8))
    pytester.makepyfile(f"import os\nimport pytest\n{tests}\n\ndef test_other():\n    pass\n")
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-p", "no:randomly")
    result.assert_outcomes(passed=9)
    workers = (pytester.path / "workers.txt").read_text().split()
    assert len(workers) == 8 and len(set(workers)) == 1, workers
