# wyoming-qwen3tts: Qwen3-TTS over the Wyoming protocol, plus an
# OpenAI-compatible speech endpoint. One Dockerfile makes both images:
#
#   standalone   docker build -t wyoming-qwen3tts .
#                docker run --gpus all -p 10200:10200 -p 8880:8880 -v ./data:/data wyoming-qwen3tts
#   add-on       the Home Assistant Supervisor builds it with BUILD_FROM taken
#                from build.yaml (Home Assistant's Ubuntu base: s6-overlay + bashio)
#
# Why no CUDA base image: CUDA comes with PyTorch's wheels. PyPI's torch 2.11
# wheels for Linux x86_64 and aarch64 are CUDA 13.0 builds that pull the CUDA
# runtime, cuBLAS and cuDNN in as nvidia-* wheels, so one recipe serves amd64
# PCs and aarch64 servers and workstations (GH200, DGX Spark) on any glibc
# base, Home Assistant's included, whose s6-overlay and bashio the add-on
# needs. The host adds only its driver, through the NVIDIA Container Toolkit
# (driver 580 or newer for CUDA 13). nvidia/cuda or NGC PyTorch bases would
# bring a second CUDA copy and no s6/bashio. Ubuntu 24.04 gives Python 3.12,
# the version the project's pinned stack was tested with.
# Other torch builds: --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
# (a CUDA 12 build, for older drivers or GPUs before Turing; cu126 where PyTorch still
# publishes it for TORCH_VERSION) or .../whl/cpu (a CPU-only image, far smaller).
ARG BUILD_FROM=ubuntu:24.04
FROM ${BUILD_FROM}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://pypi.org/simple
ARG APP_UID=1001

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    HF_HUB_DISABLE_TELEMETRY=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# Python, the venv, and the unprivileged user of standalone mode (the add-on
# runs as root: s6-overlay needs it). setpriv (util-linux) drops root later.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates \
        python3 \
        python3-venv \
        util-linux \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "${VIRTUAL_ENV}" \
    && groupadd --gid "${APP_UID}" qwen3tts \
    && useradd --uid "${APP_UID}" --gid qwen3tts --create-home \
        --shell /usr/sbin/nologin qwen3tts

# torch first: the largest layer and the one that changes least.
RUN pip install --index-url "${TORCH_INDEX_URL}" \
        "torch==${TORCH_VERSION}" "torchaudio==${TORCH_VERSION}"

# The package's dependencies, before its source, so that a code change does not
# reinstall them. constraints.txt holds the versions CI verified; torch and its
# CUDA companions are left to the step above.
WORKDIR /usr/src/wyoming-qwen3tts
COPY pyproject.toml constraints.txt ./
RUN grep -v -i -E '^(torch|torchaudio|triton|nvidia-|cuda-)' constraints.txt \
        > /tmp/constraints.txt \
    && python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
    && pip install --constraint /tmp/constraints.txt --requirement /tmp/requirements.txt \
    && rm /tmp/constraints.txt /tmp/requirements.txt

COPY README.md ./
COPY voices ./voices
COPY wyoming_qwen3tts ./wyoming_qwen3tts
RUN pip install --no-deps . \
    && python3 -m wyoming_qwen3tts.healthcheck --help > /dev/null

# MIT notices of the CPU engine's native code (qwentts.cpp, ggml) and of its wheel.
COPY licenses /usr/share/licenses/wyoming-qwen3tts
RUN for f in "${VIRTUAL_ENV}"/lib/python3*/site-packages/realtimetts_qwen_native_cpu-*.dist-info/licenses/LICENSE; do \
        if [ -e "$f" ]; then cp "$f" /usr/share/licenses/wyoming-qwen3tts/realtimetts-qwen-native-cpu.LICENSE; fi; \
    done

COPY addon/rootfs /
COPY addon/docker-entrypoint.sh /usr/local/bin/docker-entrypoint
RUN chmod a+x /usr/local/bin/docker-entrypoint \
        /etc/s6-overlay/s6-rc.d/qwen3tts/run \
        /etc/s6-overlay/s6-rc.d/qwen3tts/finish \
        /etc/s6-overlay/s6-rc.d/discovery/run

WORKDIR /
EXPOSE 10200 8880

# A real Wyoming describe. The server opens its port only once the models are
# loaded, and the first start downloads several GB of them: hence the long
# start period.
HEALTHCHECK --start-period=30m --interval=30s --timeout=10s --retries=3 \
    CMD ["python3", "-m", "wyoming_qwen3tts.healthcheck"]

LABEL org.opencontainers.image.title="wyoming-qwen3tts" \
    org.opencontainers.image.description="Qwen3-TTS text-to-speech over the Wyoming protocol, with an OpenAI-compatible endpoint" \
    org.opencontainers.image.licenses="Apache-2.0"

ENTRYPOINT ["/usr/local/bin/docker-entrypoint"]
CMD ["wyoming-qwen3tts", "--uri", "tcp://0.0.0.0:10200", "--data-dir", "/data", "--voices-dir", "/data/voices"]
