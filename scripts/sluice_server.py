"""Starts `sluice serve` for the bench scripts and waits until it is ready."""
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def serve(binary, repo, http, grpc, env=None):
    """`binary` serving `repo` on ports `http` and `grpc` with extra `env`,
    ready (GET /v2/health/ready is 200) within 5 minutes, else exits."""
    env = dict(os.environ, ORT_DYLIB_PATH=f"{ROOT}/.ort/cpu/libonnxruntime.so.1.31.1", **(env or {}))
    cmd = [binary, "serve", "--model-repository", repo, "--http-port", str(http), "--grpc-port", str(grpc)]
    p = subprocess.Popen(cmd, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    for _ in range(3000):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2).status == 200:
                return p
        except OSError:
            pass
        time.sleep(0.1)
    p.kill()
    sys.exit("the server did not become ready")
