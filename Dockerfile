# kgrade image: the API (gunicorn) and the Celery workers share it; the command picks the role.
#
#   docker build -t kgrade:cpu .                                   # CPU torch: API, CPU workers
#   docker build -t kgrade:cuda --build-arg TORCH_FLAVOR=cu128 .   # CUDA torch: GPU workers
#
# Not built on the development machine (it has no Docker engine); tests/deploy parses the
# compose and Kubernetes files that use it. See deploy/README.md.
ARG PYTHON_VERSION=3.12
ARG NODE_VERSION=20

# The pages' browser libraries: pinned npm packages (frontend/package-lock.json) built into
# service/static/vendor, as `make assets` does. Only the built files reach the image.
FROM node:${NODE_VERSION}-slim AS assets
WORKDIR /src
COPY frontend/package.json frontend/package-lock.json ./frontend/
RUN cd frontend && npm ci --no-audit --no-fund
COPY frontend ./frontend
RUN mkdir -p service/static && node frontend/build.mjs

FROM python:${PYTHON_VERSION}-slim

# cpu, or a CUDA tag of the PyTorch wheel index (cu126, cu128, ...). The CUDA wheels bring their
# own CUDA runtime; the host needs only the NVIDIA driver and the container toolkit.
ARG TORCH_FLAVOR=cpu
ARG TORCH_VERSION=2.13.0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KGRADE_VAR_DIR=/var/lib/kgrade

# bubblewrap: the grader's sandbox (namespaces for student code). tini: signals reach gunicorn
# and Celery so a worker's warm shutdown can requeue its job.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap tini \
 && rm -rf /var/lib/apt/lists/*

# torch first, from the index that matches the flavour, so the project's `torch>=...` is
# already satisfied and pip does not pull a different build.
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_FLAVOR}" "torch==${TORCH_VERSION}"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY service ./service
COPY workers ./workers
COPY kernels ./kernels
COPY item_bank ./item_bank
COPY --from=assets /src/service/static/vendor ./service/static/vendor
RUN pip install .

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
