# The archhpo image: the `archhpo` command, PyTorch, Optuna and Ray. Every service in
# docker-compose.yml (Ray head, Ray workers, dashboard, driver) runs this one image.
#
#   docker build -t archhpo .
#       torch from PyPI: on x86_64 that is the CUDA build (large; what GPU workers need)
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu -t archhpo .
#       the CPU-only torch wheel (much smaller); or a CUDA index such as .../whl/cu126
#
# No password, token or other secret is ever passed to this build: they reach the containers
# as environment variables at run time (see docker-compose.yml and .env.example).
FROM python:3.11-slim

# Empty: torch comes from PyPI together with the other dependencies.
ARG TORCH_INDEX_URL=""
# Match your own uid/gid so that files written to bind mounts (./results) belong to you.
ARG ARCHHPO_UID=1000
ARG ARCHHPO_GID=1000

ENV RAY_USAGE_STATS_ENABLED=0 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

RUN groupadd --gid "${ARCHHPO_GID}" archhpo \
 && useradd --uid "${ARCHHPO_UID}" --gid "${ARCHHPO_GID}" --create-home --shell /bin/bash archhpo \
 && mkdir -p /home/archhpo/work/results \
 && chown -R archhpo:archhpo /home/archhpo/work

WORKDIR /opt/archhpo

# Dependencies first, read from pyproject.toml (the one place they are written), so that
# editing the code does not reinstall torch and Ray. With TORCH_INDEX_URL set, torch (with
# pyproject's version range) comes from that index before everything else. pyproject bounds
# optuna, optuna-dashboard, ray and SQLAlchemy below the next minor version (archhpo uses private
# parts of Optuna and Ray, see search/_optuna_private.py and cluster/_ray_private.py), so the image
# gets the same minor versions the tests pass on; the next step prints them in the build log.
COPY pyproject.toml ./
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep=chr(10))" > /tmp/requirements.txt \
 && torch_req="$(grep -E '^torch([<>=!~ ;[]|$)' /tmp/requirements.txt)" \
 && if [ -n "${TORCH_INDEX_URL}" ]; then pip install --index-url "${TORCH_INDEX_URL}" "${torch_req}"; fi \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
RUN python -c "import optuna, optuna_dashboard, ray, sqlalchemy; print('optuna', optuna.__version__, 'optuna-dashboard', optuna_dashboard.__version__, 'ray', ray.__version__, 'sqlalchemy', sqlalchemy.__version__)"

# The repository itself (.dockerignore keeps .env, .git, results and data out of the image).
COPY . .
RUN pip install . \
 && rm -rf build ./*.egg-info

USER archhpo
WORKDIR /home/archhpo/work
ENTRYPOINT ["archhpo"]
CMD ["--help"]
