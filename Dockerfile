# kgrade image: the API (gunicorn) and the Celery workers share it; the command picks the role.
#
#   docker build -t kgrade:cpu .                                   # CPU torch: API, CPU workers
#   docker build -t kgrade:cuda --build-arg TORCH_FLAVOR=cu128 .   # CUDA torch: GPU workers
#
# Without a registry or package index (as on our development machines), `make deploy-check`
# builds it from local base images and a local wheelhouse: see deploy/check/ and
# docs/deploy-check.md for the build arguments it sets.
ARG PYTHON_VERSION=3.12
ARG NODE_VERSION=20
# The base images: the official ones by default. deploy/check/base-images.sh builds stand-ins
# from Debian packages where no registry is reachable (any Debian-like image with python3 and
# its venv module, and one with node and npm, will do).
ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim
ARG NODE_IMAGE=node:${NODE_VERSION}-slim

# The pages' browser libraries: pinned npm packages (frontend/package-lock.json) built into
# service/static/vendor, as `make assets` does. Only the built files reach the image.
FROM ${NODE_IMAGE} AS assets
WORKDIR /src
COPY frontend/package.json frontend/package-lock.json ./frontend/
RUN cd frontend && npm ci --no-audit --no-fund
COPY frontend ./frontend
RUN mkdir -p service/static && node frontend/build.mjs

# Everything Python goes into /opt/venv here; the final stage copies only the venv, so neither
# the build tools nor an offline wheelhouse end up in the image. A venv also works on a Debian
# base, whose system Python refuses `pip install` (PEP 668).
FROM ${BASE_IMAGE} AS python-deps

# cpu, or a CUDA tag of the PyTorch wheel index (cu126, cu128, ...). The CUDA wheels bring their
# own CUDA runtime; the host needs only the NVIDIA driver and the container toolkit.
ARG TORCH_FLAVOR=cpu
ARG TORCH_VERSION=2.13.0
# Where pip finds torch, and the rest. Offline: --build-arg TORCH_PIP_ARGS="--no-index
# --find-links /wheelhouse" and PIP_ARGS likewise, with the wheels in deploy/check/wheelhouse/
# (deploy/check/wheels.sh fills it; it is empty otherwise).
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/${TORCH_FLAVOR}"
ARG PIP_ARGS=""

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
COPY deploy/check/wheelhouse /wheelhouse
RUN python3 -m venv /opt/venv

# torch first, from the index that matches the flavour, so the project's `torch>=...` is
# already satisfied and pip does not pull a different build.
RUN pip install ${TORCH_PIP_ARGS} "torch==${TORCH_VERSION}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
COPY workers ./workers
COPY kernels ./kernels
COPY item_bank ./item_bank
COPY --from=assets /src/service/static/vendor ./service/static/vendor
# Not editable: the item bank, templates, migrations and assets are package data in the venv.
RUN pip install ${PIP_ARGS} . && rm -rf /opt/venv/lib/python3*/site-packages/pip

FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    KGRADE_VAR_DIR=/var/lib/kgrade

# bubblewrap: the grader's sandbox (namespaces for student code). tini: signals reach gunicorn
# and Celery so a worker's warm shutdown can requeue its job.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap tini \
 && rm -rf /var/lib/apt/lists/*

COPY --from=python-deps /opt/venv /opt/venv

# Non-root: the API and the workers never need root; bubblewrap uses user namespaces.
# /var/lib/kgrade-timing: the GPU workers of one host share its timing lock (a volume there).
RUN useradd --create-home --uid 10001 --user-group kgrade \
 && mkdir -p /var/lib/kgrade /var/lib/kgrade-timing \
 && chown kgrade:kgrade /var/lib/kgrade /var/lib/kgrade-timing
USER kgrade
WORKDIR /var/lib/kgrade

EXPOSE 8000
ENTRYPOINT ["/usr/bin/tini", "--"]
# The API. Workers override the command, e.g.
#   celery -A workers.celery_app worker -Q gpu -c 1 --pool prefork --prefetch-multiplier 1
#   celery -A service.worker worker -Q lti -c 4 --pool threads      (grade passback, rosters)
# --config: gunicorn's own refusals as the API's JSON errors, header limits the API checks under
CMD ["gunicorn", "--config", "python:service.cli.gunicorn_conf", "--bind", "0.0.0.0:8000", \
     "--workers", "4", "--timeout", "60", "--access-logfile", "-", "service:create_app()"]
