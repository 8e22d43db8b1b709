"""The standard PostgreSQL URL (postgresql://, postgres://) is the psycopg2 driver
archhpo ships with; a driver that really is missing is named in the one-sentence error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from archhpo.search._storage import resolve_storage_url, with_driver
from tests.conftest import TINY_DATA, run_cli

LAUNCH = ["launch", "--experiment", "urls", "--budget", "200K", "--trials", "4", "--quick", "--data", TINY_DATA]


@pytest.mark.parametrize(("given", "opened"), [
    ("postgresql://u@h:5432/db", "postgresql+psycopg2://u@h:5432/db"),
    ("postgres://u@h/db", "postgresql+psycopg2://u@h/db"),
    ("postgresql+psycopg2://u@h/db", "postgresql+psycopg2://u@h/db"),
    ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),  # a driver named is kept
    ("postgres+pg8000://u@h/db", "postgresql+pg8000://u@h/db"),
    ("sqlite:///x.db", "sqlite:///x.db"),
])
def test_urls_without_a_driver_get_psycopg2(given: str, opened: str) -> None:
    assert with_driver(given) == opened
    assert resolve_storage_url(given) == opened


def test_the_password_leaves_a_postgres_url() -> None:
    assert resolve_storage_url("postgres://u:secret@h/db") == "postgresql+psycopg2://u@h/db"


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_launch_on_the_bare_postgresql_url(pg_url: str, tmp_path: Path, scheme: str) -> None:
    bare = pg_url.replace("postgresql+psycopg2://", f"{scheme}://")  # e.g. postgresql://postgres@127.0.0.1:5432/db
    res = run_cli(*LAUNCH, "--storage", bare, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "created study urls_200K" in res.stderr
    again = run_cli(*LAUNCH, "--storage", bare, cwd=tmp_path)  # the same study, found again
    assert again.returncode == 0 and "reloaded study urls_200K" in again.stderr


@pytest.mark.parametrize(("driver", "module", "package"), [("psycopg", "psycopg", "psycopg[binary]"),
                                                           ("pg8000", "pg8000", "pg8000")])
def test_a_missing_driver_is_named(tmp_path: Path, driver: str, module: str, package: str) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    res = run_cli(*LAUNCH, "--storage", f"postgresql+{driver}://postgres@127.0.0.1:5432/test", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert f"The database driver '{driver}'" in lines[0] and package in lines[0] and "postgresql://" in lines[0]
    assert "psycopg2-binary" not in lines[0]
    assert not list(tmp_path.iterdir())


def test_an_unknown_driver_is_named(tmp_path: Path) -> None:
    res = run_cli(*LAUNCH, "--storage", "postgresql+nosuch://postgres@127.0.0.1:5432/test", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "'nosuch'" in res.stderr and "SQLAlchemy knows" in res.stderr


# ------------------------------------------------------------------ passwords in every form
@pytest.mark.parametrize(("given", "masked", "bare", "password"), [
    ("postgresql://u:s3cret@h:5432/db", "postgresql://u:***@h:5432/db", "postgresql://u@h:5432/db", "s3cret"),
    # an unencoded '@' stays in the password: the last '@' before the host is the separator
    ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db", "postgresql://u@h/db", "p@ss"),
    ("postgresql://u:a@b:c@h/db", "postgresql://u:***@h/db", "postgresql://u@h/db", "a@b:c"),
    ("postgresql://u:p%40ss%2F1@h/db", "postgresql://u:***@h/db", "postgresql://u@h/db", "p@ss/1"),
    ("postgresql://u@h/db?password=s3cret", "postgresql://u@h/db?password=***", "postgresql://u@h/db", "s3cret"),
    ("postgresql://u@h/db?sslmode=require&password=p%26q", "postgresql://u@h/db?sslmode=require&password=***",
     "postgresql://u@h/db?sslmode=require", "p&q"),
    ("postgresql://u@h/db?password=s3cret&sslmode=require", "postgresql://u@h/db?password=***&sslmode=require",
     "postgresql://u@h/db?sslmode=require", "s3cret"),
    ("postgresql://u@h/db?PASSWORD=s3cret", "postgresql://u@h/db?PASSWORD=***", "postgresql://u@h/db", "s3cret"),
    ("postgresql://u@h/db?pass%77ord=s3cret", "postgresql://u@h/db?pass%77ord=***", "postgresql://u@h/db", "s3cret"),
    ("postgresql://u:one@h/db?password=two", "postgresql://u:***@h/db?password=***", "postgresql://u@h/db", "two"),
    ("postgresql://u@h/db?sslmode=require", "postgresql://u@h/db?sslmode=require",
     "postgresql://u@h/db?sslmode=require", None),
    ("sqlite:////abs/x:y@z.db", "sqlite:////abs/x:y@z.db", "sqlite:////abs/x:y@z.db", None),
])
def test_every_form_of_a_password_in_a_url_is_masked_and_split_off(given: str, masked: str, bare: str,
                                                                    password: str | None) -> None:
    from archhpo._urls import split_password
    from archhpo.search._storage import mask_url

    assert mask_url(given) == masked
    assert split_password(given) == (bare, password)


def test_a_url_in_a_message_is_masked_and_the_message_kept() -> None:
    from archhpo.search._storage import mask_url

    msg = "connect to postgresql://u:p@ss@h/db failed; see postgresql://v@h2/db?password=x&a=1 (user@example)"
    assert mask_url(msg) == ("connect to postgresql://u:***@h/db failed; see postgresql://v@h2/db?password=***&a=1 "
                             "(user@example)")


@pytest.mark.parametrize("form", ["postgresql://postgres:Canary-p@ss@{host}/nosuch_db",
                                  "postgresql://postgres@{host}/nosuch_db?password=Canary-pass"])
def test_a_refused_launch_never_shows_any_part_of_the_password(tmp_path: Path, form: str) -> None:
    """The unencoded '@' once split the URL at the first '@', and the error named the host
    "ss@127.0.0.1": the password's tail."""
    url = form.format(host="127.0.0.1:1")  # nothing listens on port 1: refused at once
    res = run_cli(*LAUNCH, "--storage", url, cwd=tmp_path, env={"PGPASSWORD": ""})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "Cannot open the study database postgresql+psycopg2://postgres@127.0.0.1:1/nosuch_db" in res.stderr
    assert "Canary" not in res.stderr and "ss@" not in res.stderr
    assert not list(tmp_path.iterdir())
