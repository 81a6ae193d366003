"""Starts `sluice serve` for the bench scripts and waits until it is ready."""
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def serve(binary, repo, http, grpc, env=None, args=(), log=subprocess.DEVNULL, seconds=300):
    """`binary` serving `repo` on ports `http` and `grpc` with extra `env` and
    command-line `args`, its output to `log`; returns once it is ready (GET
    /v2/health/ready is 200). Exits if it is not within `seconds`, or exits first."""
    env = {**os.environ, "ORT_DYLIB_PATH": f"{ROOT}/.ort/cpu/libonnxruntime.so.1.31.1", **(env or {})}
    cmd = [os.path.abspath(binary), "serve", "--model-repository", repo, "--http-port", str(http),
           "--grpc-port", str(grpc), *args]
    p = subprocess.Popen(cmd, env=env, cwd=tempfile.gettempdir(), stdout=log, stderr=log)
    for _ in range(int(seconds * 10)):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2).status == 200:
                return p
        except OSError:
            pass
        if p.poll() is not None:
            sys.exit(f"sluice exited with {p.returncode} before it was ready")
        time.sleep(0.1)
    p.kill()
    sys.exit(f"sluice did not become ready in {seconds} s")
