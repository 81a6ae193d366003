# The two README commands: `make serve` and `make test`. Both do all set-up
# they need on a fresh machine (ONNX Runtime from the pinned PyPI wheel).

ORT_LIB := .ort/cpu/libonnxruntime.so.1.31.1

.PHONY: serve test setup test-clients models bench

## serve: serve model-repository/ on :8080 (release build)
serve: setup
	cargo run --release -- serve

## test: every test (unit + end-to-end against real ONNX Runtime and the standard clients)
test: setup test-clients
	cargo test

## bench: end-to-end serving benchmark, prints Markdown tables (benches/README.md)
bench: setup
	cargo bench --bench serving

setup: $(ORT_LIB)

## test-clients: tritonclient and perf_analyzer for tests/standard_clients.rs (.venv-clients; idempotent)
test-clients:
	scripts/setup-test-clients.sh

$(ORT_LIB): scripts/fetch-onnxruntime.sh
	scripts/fetch-onnxruntime.sh

## models: regenerate model-repository/ and tests/fixtures/ (Python venv)
models:
	scripts/setup-python.sh
	.venv/bin/python scripts/make_models.py
