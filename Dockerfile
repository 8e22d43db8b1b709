# The archhpo image: the `archhpo` command, PyTorch, Optuna and Ray. Every service in
# docker-compose.yml (Ray head, Ray workers, dashboard, driver) runs this one image.
#
#   docker build -t archhpo .
#       torch from PyPI: on x86_64 that is the CUDA build (large; what GPU workers need)
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu -t archhpo .
#       the CPU-only torch wheel (much smaller); or a CUDA index such as .../whl/cu126
#   docker build --build-arg BASE_IMAGE=local/debian:bookworm --network host -t archhpo .
#       no image registry: any Debian/Ubuntu image you have (python3 is installed with apt if
#       the base lacks it); with wheels in ./wheelhouse nothing is fetched from PyPI (see
#       wheelhouse/README.md and the README's "Air-gapped node")
#
# Needs BuildKit (the default builder since Docker 23; `docker buildx` on older engines): the
# wheelhouse and the source are bind-mounted into the install steps, so no wheel is left in
# any layer. No password, token or other secret is ever passed to this build: they reach the
# containers as environment variables at run time (see docker-compose.yml and .env.example).
ARG BASE_IMAGE=python:3.11-slim

# ---------------------------------------------------------------- build stage: /opt/venv
FROM ${BASE_IMAGE} AS build

# Empty: torch comes from PyPI together with the other dependencies.
ARG TORCH_INDEX_URL=""

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:$PATH

# A bare Debian base has no Python: take Debian's (3.11 on bookworm, as python:3.11-slim).
RUN if ! command -v python3 >/dev/null || ! python3 -c "import venv, ensurepip" 2>/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/venv

WORKDIR /opt/archhpo

# Dependencies first, read from pyproject.toml (the one place they are written), so that
# editing the code does not reinstall torch and Ray. With wheels in ./wheelhouse everything
# comes from there and no index is asked (air-gapped nodes). Otherwise, with TORCH_INDEX_URL
# set, torch (with pyproject's version range) comes from that index before everything else.
# pyproject bounds optuna, optuna-dashboard, ray and SQLAlchemy below the next minor version
# (archhpo uses private parts of Optuna and Ray, see search/_optuna_private.py and
# cluster/_ray_private.py), so the image gets the same minor versions the tests pass on; the
# next step prints them in the build log.
COPY pyproject.toml ./
RUN --mount=type=bind,source=wheelhouse,target=/tmp/wheelhouse \
    python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep=chr(10))" > /tmp/requirements.txt \
 && torch_req="$(grep -E '^torch([<>=!~ ;[]|$)' /tmp/requirements.txt)" \
 && if ls /tmp/wheelhouse/*.whl >/dev/null 2>&1; then \
        pip install --no-index --find-links /tmp/wheelhouse setuptools wheel -r /tmp/requirements.txt; \
    else \
        if [ -n "${TORCH_INDEX_URL}" ]; then pip install --index-url "${TORCH_INDEX_URL}" "${torch_req}"; fi \
        && pip install setuptools wheel -r /tmp/requirements.txt; \
    fi \
 && rm /tmp/requirements.txt
RUN python -c "import optuna, optuna_dashboard, ray, sqlalchemy, torch; print('optuna', optuna.__version__, 'optuna-dashboard', optuna_dashboard.__version__, 'ray', ray.__version__, 'sqlalchemy', sqlalchemy.__version__, 'torch', torch.__version__)"

# The repository itself, from a writable copy of the build context (.dockerignore keeps .env,
# .git, results and data out of it); build files stay out of the image.
RUN --mount=type=bind,target=/opt/src,rw \
    cd /opt/src && pip install --no-deps --no-build-isolation . \
 && archhpo --help >/dev/null

# ---------------------------------------------------------------- runtime image
FROM ${BASE_IMAGE}

# Match your own uid/gid so that files written to bind mounts (./results) belong to you
# (`id -u`, `id -g`; --non-unique lets an operator who works as root build with 0).
ARG ARCHHPO_UID=1000
ARG ARCHHPO_GID=1000

ENV RAY_USAGE_STATS_ENABLED=0 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:$PATH

# The venv's python is a link to the base's python3: install it where the base lacks it.
RUN if ! command -v python3 >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
 && groupadd --non-unique --gid "${ARCHHPO_GID}" archhpo \
 && useradd --non-unique --uid "${ARCHHPO_UID}" --gid "${ARCHHPO_GID}" --create-home --shell /bin/bash archhpo \
 && mkdir -p /home/archhpo/work/results \
 && chown -R "${ARCHHPO_UID}:${ARCHHPO_GID}" /home/archhpo/work

COPY --from=build /opt/venv /opt/venv

USER archhpo
WORKDIR /home/archhpo/work
ENTRYPOINT ["archhpo"]
CMD ["--help"]
