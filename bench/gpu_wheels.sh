#!/usr/bin/env bash
# The Python packages keyheads needs that a prepared GPU machine without network access may lack or hold in
# another version, as wheels for its Python 3.12 (x86-64), into .whl/ (git-ignored). On that machine:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:src && python3 -m bench.fsdp gpu-offload
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
# the versions requirements/dev.txt pins, and what pydantic-settings and transformers need beside them
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl pydantic==2.14.3 pydantic_core==2.50.4 pydantic-settings==2.16.3 annotated-types typing-inspection \
    python-dotenv transformers==5.23.0 tokenizers==0.23.3 huggingface_hub==2.4.0 accelerate==1.15.0 \
    safetensors==0.8.0 peft==0.21.2 gguf==0.19.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
    typing_extensions==4.16.0 click==8.5.1 hf-xet==1.8.0 regex==2026.11.19 typer==0.29.2 anyio==4.16.0 filelock==4.3.1 \
    fsspec==2026.9.0
du -sh .whl
