#!/usr/bin/env bash
# Everything in the project that needs a CUDA GPU, in one pass of about ten minutes:
#   1. the Triton kernel tests and the CUDA sampling test, on the device;
#   2. parity with transformers (tests/e2e) on the default path, which on CUDA is Triton;
#   3. benchmarks.kernels_gpu: decode-kernel bandwidth against the device's peak;
#   4. benchmarks.throughput on the GPU: pagedserve against transformers `generate`;
#   5. a served run: `pagedserve serve --device cuda` measured by `pagedserve bench`.
# Each step has its own time limit and a failed step does not stop the next. Logs and JSON go
# to $OUT (default ./gpu-results); the last line printed is the exit status of each step.
# The tests run one pytest process per file, so that a crash names its file.
#
#   bash benchmarks/gpu_check.sh            # python3 with torch (CUDA), triton, transformers
#   STEPS="tests throughput" bash benchmarks/gpu_check.sh
#   TESTS="tests/e2e/test_*.py" FILE_LIMIT=240 STEPS=tests bash benchmarks/gpu_check.sh
set -uo pipefail

out=${OUT:-gpu-results}
py=${PYTHON:-python3}
port=${PORT:-8017}
work=$(mktemp -d)
repo=$(pwd)
mkdir -p "$out"
steps=" ${STEPS:-tests kernels throughput serve} "
declare -A status

wanted() { [[ $steps == *" $1 "* ]]; }

step() {  # step NAME LIMIT_S COMMAND...: runs COMMAND with a limit, logs to $out/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%T), limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log" | tail -n 25
    status[$name]=${PIPESTATUS[0]}
}

{
    nvidia-smi -L
    "$py" -c 'import sys, torch, triton, transformers; print(sys.version.split()[0], "torch",
torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__,
torch.cuda.get_device_name())'
} 2>&1 | tee "$out/env.txt"

run_tests() {  # one pytest process per file: a crash in one file does not hide the others
    local rc=0 file log
    # The files whose code runs differently with CUDA present; the CPU backends' own tests
    # (test_cpu_*, test_compiled_attention) pass on a GPU machine too, at CI's pace.
    local files=${TESTS:-tests/kernels/test_triton_*.py tests/kernels/test_reference_*.py
        tests/sampling/test_sampling_cuda.py tests/e2e/test_*.py}
    for file in $files; do
        log=$(mktemp)
        timeout --kill-after=10 "${FILE_LIMIT:-120}" "$py" -m pytest -q -p no:cacheprovider -o addopts= \
            -rfE --tb=short "$file" >"$log" 2>&1 || rc=1
        echo "$file: $(grep -E '(passed|failed|error|skipped)' "$log" | tail -n 1)"
        grep -E '^(FAILED|ERROR)|Fatal Python error' "$log"
        cat "$log" >>"$out/tests-full.log"
        rm -f "$log"
    done
    return $rc
}
if wanted tests; then
    echo "== tests ($(date -u +%T))"
    run_tests 2>&1 | tee "$out/tests.log"
    status[tests]=${PIPESTATUS[0]}
fi

wanted kernels && step kernels 100 "$py" -m benchmarks.kernels_gpu --reps 20

wanted throughput && step throughput 200 "$py" -m benchmarks.throughput --device cuda \
    --hidden-size 1024 --num-layers 8 --num-requests 150

serve_run() {
    # The server runs from outside the checkout, as an installed pagedserve does; the
    # benchmarks package is read from the checkout.
    (cd "$work" && PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$py" - "$work/model" \
        <<'EOF') || return 1
import sys
from benchmarks.peer_model import PeerModelShape, build_peer_model
build_peer_model(sys.argv[1], PeerModelShape(
    hidden_size=2048, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=8,
    intermediate_size=5504, vocab_size=8192))
EOF
    "$py" -m pagedserve.cli.main serve --model "$work/model" --device cuda \
        --dtype bfloat16 --host 127.0.0.1 --port "$port" --max-num-seqs 256 \
        >"$out/server.log" 2>&1 &
    local server=$!
    local ready=0
    for _ in $(seq 150); do
        if "$py" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health')" \
            2>/dev/null; then ready=1; break; fi
        sleep 1
    done
    local rc=1
    if [ "$ready" = 1 ]; then
        timeout 150 "$py" -m pagedserve.cli.main bench --base-url "http://127.0.0.1:$port" \
            --model "$work/model" --tokenizer server --dataset-name random \
            --random-input-len 256 --random-output-len 128 --num-prompts 1024 \
            --max-concurrency 256 --request-rate inf --ignore-eos --seed 0 --disable-tqdm \
            --result-json "$out/serve.json" --request-timeout 120
        rc=$?
    else
        echo "the server did not answer /health in 150 s"; tail -n 40 "$out/server.log"
    fi
    kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
    return $rc
}
if wanted serve; then
    echo "== serve ($(date -u +%T))"
    serve_run 2>&1 | tee "$out/serve.log" | tail -n 40
    status[serve]=${PIPESTATUS[0]}
fi

rm -rf "$work"
for name in tests kernels throughput serve; do
    printf '%s=%s ' "$name" "${status[$name]:-not run}"
done
echo
