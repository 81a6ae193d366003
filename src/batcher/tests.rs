//! Batcher tests against a fake runtime (no ONNX Runtime), with tokio time.
