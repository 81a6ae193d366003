#!/usr/bin/env python3
"""Validates sluice's deployment files offline (run by tests/deploy.rs).

- deploy/k8s/*.yaml: the core kinds (Deployment, Service, ConfigMap,
  PersistentVolumeClaim) against Kubernetes' own schemas, strict (an unknown
  field is an error), with `kubernetes-validate`; and how they fit together:
  the ConfigMap's sluice.toml uses only keys of config/sluice.toml, the
  grace period covers shutdown.grace_period_seconds + the preStop sleep, the
  probes, ports, volumes, selectors and scrape annotations agree.
- deploy/kserve/*.yaml: ClusterServingRuntime and InferenceService against
  the openAPIV3Schema of KServe's CRDs vendored in tests/fixtures/kserve/
  (hash-checked), strict like `kubectl apply --validate=strict`; and the
  runtime and the InferenceService agree (format, protocol, batching values,
  containerConcurrency >= max_batch_size or 0).
- deploy/grafana/sluice.json and deploy/prometheus/alerts.yaml: every PromQL
  expression parses (promql-parser), and with --metrics-url every metric it
  names exists in that running sluice's /metrics, with the labels it matches,
  groups or prints, and the label values it matches (seen in /metrics, or,
  for `status` values a short test does not provoke, an error kind that
  src/error.rs defines).

Prints one line per check and ends with "manifests: N passed, M failed";
exits 1 when any check failed.

Usage: validate_manifests.py [--root DIR] [--metrics-url URL]
                             [--extra-expr PROMQL]... [--write-config FILE]
--extra-expr adds an expression to check, as if the dashboard had it (the
test makes sure a made-up metric name is caught); --write-config writes the
ConfigMap's sluice.toml to FILE (the test loads it with sluice's own loader).
"""

import argparse
import copy
import hashlib
import json
import re
import sys
import tomllib
import urllib.request
from pathlib import Path

import jsonschema
import kubernetes_validate
import promql_parser
import yaml

# The Kubernetes version whose schemas the core kinds are checked against
# (kubernetes-validate ships 1.25 to 1.37). 1.30: `lifecycle.preStop.sleep`
# is on by default from 1.30.
K8S_VERSION = "1.30.0"

# tests/fixtures/kserve/: (apiVersion, kind) -> (file, sha256). See its README.
KSERVE_CRDS = {
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): (
        "serving.kserve.io_clusterservingruntimes.yaml",
        "f721d19516670d4a81181e231b1e58cbc32c36435969182ae457fad537151cc8",
    ),
    ("serving.kserve.io/v1beta1", "InferenceService"): (
        "serving.kserve.io_inferenceservices.yaml",
        "57c3bf13f77de94678bf2ae3748056ec071ad2b9e88d6a28f44fb4710758fcff",
    ),
}

# tests/fixtures/keda/: the ScaledObject CRD of kedacore/keda, as KSERVE_CRDS.
KEDA_CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): (
        "keda.sh_scaledobjects.yaml",
        "207afc4ca44fd9e3f4bbfb1c8fae08f3a365e098a52714fe8eb672bbd239cbcd",
    ),
}
# The protocol versions KServe knows (pkg/constants: v1, v2, grpc-v1, grpc-v2).
KSERVE_PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
# The seed's KServe batcher values: maxBatchSize 32, maxLatency 500 ms.
SEED_MAX_BATCH_SIZE = 32
SEED_MAX_BATCH_TIME = 0.5

# Series that Prometheus itself makes, not sluice.
PROMETHEUS_SERIES = {"up"}
# Labels that the scrape adds to every series (target labels).
TARGET_LABELS = {"job", "instance", "namespace", "pod"}
# Stand-ins for Grafana's variables, so that a dashboard query parses.
GRAFANA_VARS = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "${model}": ".+",
    "$model": ".+",
}

passed = 0
failed = 0


def check(ok, what, detail=""):
    """Records one check and prints it."""
    global passed, failed
    if ok:
        passed += 1
        print(f"ok    {what}")
    else:
        failed += 1
        print(f"FAIL  {what}{': ' + detail if detail else ''}")
    return ok


# libyaml's loader when the wheel has it (the InferenceService CRD is 2 MB).
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_docs(path):
    with open(path) as f:
        return [d for d in yaml.load_all(f, Loader=SafeLoader) if d]


# ---------------------------------------------------------------- Kubernetes


def validate_core(doc, where):
    name = f"{where}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    try:
        v = kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        check(True, f"{name} is a valid Kubernetes {v} object (strict)")
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        check(False, f"{name} is a valid Kubernetes {K8S_VERSION} object (strict)", f"{path}: {e.message}")
    except Exception as e:  # SchemaNotFoundError and the like carry .message
        check(False, f"{name} has a Kubernetes schema", getattr(e, "message", str(e)))


def strict_schema(schema):
    """The schema with `additionalProperties: false` wherever an object lists
    its properties and does not say otherwise (a structural CRD schema prunes
    unknown fields; `kubectl apply --validate=strict` refuses them)."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


def crd_schema(fixtures, api_version, kind):
    file, sha = {**KSERVE_CRDS, **KEDA_CRDS}[(api_version, kind)]
    path = fixtures / file
    data = path.read_bytes()
    if not check(hashlib.sha256(data).hexdigest() == sha, f"{path.name}: sha256 as in tests/fixtures/{path.parent.name}/README.md"):
        return None
    crd = yaml.load(data, Loader=SafeLoader)
    group, version = api_version.split("/")
    ok = crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    if not check(ok and version in versions, f"{path.name} defines {kind} {api_version}"):
        return None
    return strict_schema(versions[version]["schema"]["openAPIV3Schema"])


def validate_crd_object(doc, where, fixtures):
    key = (doc.get("apiVersion"), doc.get("kind"))
    name = f"{where}: {key[1]}/{doc.get('metadata', {}).get('name')}"
    schema = crd_schema(fixtures, *key)
    if schema is None:
        return
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    detail = "; ".join(f"{'.'.join(str(p) for p in e.path) or '(top)'}: {e.message}" for e in errors[:5])
    check(not errors, f"{name} is valid against the CRD's openAPIV3Schema (strict)", detail)


DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def flag(args, name):
    """The value after `name` in an argument list, or None."""
    for i, a in enumerate(args[:-1]):
        if a == name:
            return args[i + 1]
    return None


def check_kserve(docs, where):
    csrs = [d for d in docs if d["kind"] == "ClusterServingRuntime"]
    isvcs = [d for d in docs if d["kind"] == "InferenceService"]
    if not check(len(csrs) == 1 and len(isvcs) >= 1, f"{where}: one ClusterServingRuntime and an InferenceService"):
        return
    check(any("nvidia.com/gpu" in i["spec"]["predictor"].get("model", {}).get("resources", {}).get("limits", {}) for i in isvcs),
          f"{where}: an InferenceService on a GPU")
    rt = csrs[0]
    spec = rt["spec"]
    name = rt["metadata"]["name"]
    check(name == "kserve-sluice", f"runtime is named kserve-sluice", name)
    formats = {f["name"]: f for f in spec.get("supportedModelFormats", [])}
    onnx = formats.get("onnx", {})
    check(onnx.get("autoSelect") is True, "runtime claims the onnx format with autoSelect", str(formats))
    protocols = spec.get("protocolVersions", [])
    check(set(protocols) <= KSERVE_PROTOCOLS, "runtime's protocolVersions are KServe's", str(protocols))
    check(sorted(protocols) == ["grpc-v2", "v1", "v2"], "runtime speaks v1, v2 and grpc-v2", str(protocols))
    check(spec.get("multiModel") is False, "runtime is single-model (storage initializer layout)")
    containers = {c["name"]: c for c in spec["containers"]}
    c = containers.get("kserve-container")
    if not check(c is not None, "runtime has a kserve-container", str(list(containers))):
        return
    args = c.get("args", [])
    check(args[:1] == ["serve"], "kserve-container runs `sluice serve`", str(args))
    check(flag(args, "--model-repository") == "/mnt/models", "it serves /mnt/models (the storage initializer's folder)", str(args))
    check(flag(args, "--model-name") == "{{.Name}}", "it names the model after the InferenceService ({{.Name}})", str(args))
    env = env_of(c)
    ports = [p["containerPort"] for p in c.get("ports", [])]
    check(env.get("SLUICE_HTTP__PORT") is not None and ports == [int(env["SLUICE_HTTP__PORT"])],
          "its one container port is sluice's HTTP port", f"ports {ports}, env {env}")
    probe = c.get("readinessProbe", {}).get("httpGet", {})
    check(probe.get("path") == "/v2/health/ready" and probe.get("port") in ports,
          "its readiness probe is /v2/health/ready on that port", str(probe))
    sc = c.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0, "it runs as non-root", str(sc))
    check(bool(c.get("resources", {}).get("requests")), "it requests resources")
    ann = spec.get("annotations", {})
    check(ann.get("prometheus.kserve.io/path") == "/metrics" and ann.get("prometheus.kserve.io/port") in {str(p) for p in ports},
          "KServe's metrics annotations name /metrics on the HTTP port", str(ann))

    for isvc in isvcs:
        n = isvc["metadata"]["name"]
        check(DNS_LABEL.match(n) is not None, f"InferenceService {n}: its name is a DNS-1035 label")
        pred = isvc["spec"]["predictor"]
        m = pred.get("model", {})
        check(m.get("runtime") == name, f"InferenceService {n} uses runtime {name}", str(m.get("runtime")))
        fmt = m.get("modelFormat", {}).get("name")
        check(fmt == "onnx" and fmt in formats, f"InferenceService {n}: modelFormat onnx, which the runtime claims", str(fmt))
        pv = m.get("protocolVersion", "v1")
        check(pv in protocols, f"InferenceService {n}: protocolVersion {pv} is one the runtime speaks")
        check(bool(m.get("storageUri")), f"InferenceService {n} has a storageUri")
        env = env_of(m)
        size = env.get("SLUICE_MODEL_MAX_BATCH_SIZE")
        time_ = env.get("SLUICE_MODEL_MAX_BATCH_TIME")
        check(size is not None and int(size) == SEED_MAX_BATCH_SIZE,
              f"InferenceService {n}: SLUICE_MODEL_MAX_BATCH_SIZE = maxBatchSize {SEED_MAX_BATCH_SIZE}", str(size))
        check(time_ is not None and float(time_) == SEED_MAX_BATCH_TIME,
              f"InferenceService {n}: SLUICE_MODEL_MAX_BATCH_TIME = maxLatency 500 ms in seconds", str(time_))
        batcher = pred.get("batcher")
        check(batcher is None, f"InferenceService {n}: no `batcher` (KServe's V1-only sidecar in front of sluice's own batcher)", str(batcher))
        limits = m.get("resources", {}).get("limits", {})
        if "nvidia.com/gpu" in limits:
            # A GPU needs the CUDA image: KServe's runtimeVersion is the tag
            # Dockerfile.cuda's header builds (`sluice:cuda`).
            check(m.get("runtimeVersion") == "cuda",
                  f"InferenceService {n} asks for a GPU and runs the CUDA image (runtimeVersion cuda)", str(m.get("runtimeVersion")))
            check(m.get("resources", {}).get("requests", {}).get("nvidia.com/gpu") == limits["nvidia.com/gpu"],
                  f"InferenceService {n}: GPU request equals its limit (extended resources cannot be overcommitted)")
        else:
            check(m.get("runtimeVersion") in (None, "latest"),
                  f"InferenceService {n} has no GPU and runs the CPU image", str(m.get("runtimeVersion")))
        cc = pred.get("containerConcurrency")
        check(cc is not None and (cc == 0 or cc >= int(size or 0)),
              f"InferenceService {n}: containerConcurrency {cc} is 0 or >= max_batch_size {size}")


def flatten_keys(table, prefix=""):
    """{'a': {'b': 1}} -> {'a.b': 1} (tables only; arrays are values)."""
    out = {}
    for k, v in table.items():
        if isinstance(v, dict):
            out.update(flatten_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_k8s(docs, where, root, write_config=None):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    for kind in ("Deployment", "Service", "ConfigMap", "PersistentVolumeClaim"):
        check(len(by_kind.get(kind, [])) == 1, f"{where}: one {kind}")
    try:
        dep = by_kind["Deployment"][0]
        svc = by_kind["Service"][0]
        cm = by_kind["ConfigMap"][0]
        pvc = by_kind["PersistentVolumeClaim"][0]
    except (KeyError, IndexError):
        return
    pod = dep["spec"]["template"]
    pspec = pod["spec"]
    c = pspec["containers"][0]
    args = c.get("args", [])
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pspec.get("volumes", [])}
    check(set(mounts) <= set(volumes), "every volumeMount has a volume", f"{set(mounts) - set(volumes)}")

    # The ConfigMap's sluice.toml.
    default = flatten_keys(tomllib.loads((root / "config/sluice.toml").read_text()))
    config_path = flag(args, "--config")
    cm_volume = next((v for v in volumes.values() if v.get("configMap", {}).get("name") == cm["metadata"]["name"]), None)
    cm_mount = next((m for m in mounts.values() if cm_volume and m["name"] == cm_volume["name"]), None)
    key = None
    if check(cm_mount is not None and config_path is not None, "the Deployment mounts the ConfigMap and passes --config"):
        check(config_path.startswith(cm_mount["mountPath"].rstrip("/") + "/"), f"--config {config_path} lies in the ConfigMap's mount")
        key = config_path.rsplit("/", 1)[1]
    toml_text = cm.get("data", {}).get(key or "sluice.toml")
    if not check(toml_text is not None, f"the ConfigMap holds {key or 'sluice.toml'}"):
        return
    if write_config:
        Path(write_config).write_text(toml_text)
    try:
        toml = flatten_keys(tomllib.loads(toml_text))
    except tomllib.TOMLDecodeError as e:
        check(False, "the ConfigMap's sluice.toml parses", str(e))
        return
    unknown = sorted(set(toml) - set(default))
    check(not unknown, "the ConfigMap's sluice.toml uses only keys of config/sluice.toml", ", ".join(unknown))

    def same_type(a, b):
        num = (int, float)
        if isinstance(b, float):
            return isinstance(a, num) and not isinstance(a, bool)
        return type(a) is type(b)

    wrong = [k for k in toml if k in default and not same_type(toml[k], default[k])]
    check(not wrong, "each of its values has the type of config/sluice.toml's", ", ".join(wrong))

    # Grace period: preStop sleep + shutdown.grace_period_seconds.
    grace = float(toml.get("shutdown.grace_period_seconds", default["shutdown.grace_period_seconds"]))
    pre = c.get("lifecycle", {}).get("preStop", {})
    sleep = pre.get("sleep", {}).get("seconds", 0)
    if "exec" in pre:
        m = re.search(r"sleep\s+(\d+)", " ".join(pre["exec"].get("command", [])))
        sleep = int(m.group(1)) if m else 0
    tgps = pspec.get("terminationGracePeriodSeconds", 30)
    check(tgps >= grace + sleep,
          f"terminationGracePeriodSeconds {tgps} >= preStop sleep {sleep} + shutdown.grace_period_seconds {grace:g}")

    # Service links: Kubernetes writes SLUICE_SERVICE_* / SLUICE_PORT_* for a
    # Service named sluice; the pod does without them.
    check(pspec.get("enableServiceLinks") is False,
          "the Deployment's pod spec sets enableServiceLinks: false")

    # Ports, the model repository, probes.
    http_port = toml.get("http.port", default["http.port"])
    grpc_port = toml.get("grpc.port", default["grpc.port"])
    cports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    check(sorted(cports.values()) == sorted([http_port, grpc_port]),
          f"the container ports are sluice's HTTP {http_port} and gRPC {grpc_port}", str(cports))
    repo = flag(args, "--model-repository")
    check(args[:1] == ["serve"] and repo is not None, "the container runs `sluice serve --model-repository ...`", str(args))
    check(toml.get("model_repository.path", repo) == repo, "sluice.toml's model_repository.path is the same folder")
    models_mount = next((m for m in mounts.values() if m["mountPath"].rstrip("/") == (repo or "").rstrip("/")), None)
    if check(models_mount is not None, f"the model repository {repo} is a mounted volume"):
        claim = volumes[models_mount["name"]].get("persistentVolumeClaim", {}).get("claimName")
        check(claim is None or claim == pvc["metadata"]["name"], "its claim is the PersistentVolumeClaim", str(claim))

    def port_of(probe):
        p = probe.get("httpGet", {}).get("port")
        return cports.get(p, p)

    for probe, path in (("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live"),
                        ("startupProbe", None)):
        p = c.get(probe)
        if not check(p is not None, f"the container has a {probe}"):
            continue
        got = p.get("httpGet", {}).get("path")
        check((got == path if path else got in {"/v2/health/ready", "/v2/health/live"}) and port_of(p) == http_port,
              f"{probe} is GET {path or got} on the HTTP port", str(p))

    ann = pod["metadata"].get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/path") == "/metrics"
          and ann.get("prometheus.io/port") == str(http_port),
          "the pod carries the Prometheus scrape annotations for /metrics on the HTTP port", str(ann))
    res = c.get("resources", {})
    check({"cpu", "memory"} <= set(res.get("requests", {})), "the container requests cpu and memory", str(res))
    psc, csc = pspec.get("securityContext", {}), c.get("securityContext", {})
    uid = csc.get("runAsUser", psc.get("runAsUser", 0))
    check((csc.get("runAsNonRoot") or psc.get("runAsNonRoot")) is True and uid != 0, "it runs as non-root", f"uid {uid}")
    check(csc.get("readOnlyRootFilesystem") is True, "its root filesystem is read-only")

    # The Service reaches the pods.
    labels = pod["metadata"].get("labels", {})
    sel = svc["spec"].get("selector", {})
    check(bool(sel) and all(labels.get(k) == v for k, v in sel.items()), "the Service selects the Deployment's pods", str(sel))
    check(dep["spec"]["selector"]["matchLabels"].items() <= labels.items(), "the Deployment's selector matches its pods")
    for p in svc["spec"]["ports"]:
        t = p.get("targetPort", p["port"])
        check(t in cports or t in cports.values(), f"Service port {p['name']} targets a container port", str(t))


# ---------------------------------------------------------------- PromQL


def grafana_exprs(dash):
    """(where, expr, legend) of every query of every panel, rows included."""
    out = []

    def panels(ps):
        for p in ps:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f"panel {p.get('title')!r} {t.get('refId')}", t["expr"], t.get("legendFormat", "")))
            panels(p.get("panels", []))

    panels(dash.get("panels", []))
    return out


def substitute(expr):
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    return expr


class Uses:
    """What an expression needs from /metrics."""

    def __init__(self):
        self.selectors = []  # (name, [(label, op, value)])
        self.grouping = []  # (label, [names it must be on])

    def names(self):
        return {n for n, _ in self.selectors}


def analyse(expr):
    """Parses `expr` (raises on a syntax error) and lists what it uses."""
    ast = promql_parser.parse(expr)
    uses = Uses()

    def selectors_under(node):
        found = []

        def visit(n):
            if isinstance(n, promql_parser.VectorSelector):
                found.append(n.name)

        promql_parser.walk(node, visit)
        return found

    def visit(n):
        if isinstance(n, promql_parser.VectorSelector):
            matchers = [(m.name, str(m.op).split(".")[-1], m.value) for m in n.matchers.matchers]
            uses.selectors.append((n.name, matchers))
        elif isinstance(n, promql_parser.AggregateExpr) and n.modifier is not None:
            if str(n.modifier.type).endswith("By"):
                names = selectors_under(n.expr)
                for label in n.modifier.labels:
                    uses.grouping.append((label, names))

    promql_parser.walk(ast, visit)
    return uses


def parse_exposition(text):
    """Prometheus text format -> {sample name: {label: {values}}}."""
    samples = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+\S+(\s+\d+)?$')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = line_re.match(line)
        if not m:
            raise ValueError(f"not Prometheus text format: {line!r}")
        labels = samples.setdefault(m.group(1), {})
        for k, v in label_re.findall(m.group(3) or ""):
            labels.setdefault(k, set()).add(v)
    return samples


def family(name):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def error_kinds(root):
    """The `status` values sluice can report: "ok" and ErrorKind::as_str's."""
    text = (root / "src/error.rs").read_text()
    return {"ok"} | set(re.findall(r'ErrorKind::\w+\s*=>\s*"([a-z_]+)"', text))


def check_metrics(uses_by_source, samples, root):
    """Every metric, label and label value the expressions use is in /metrics."""
    statuses = error_kinds(root)
    check(len(statuses) > 5, f"src/error.rs lists sluice's error kinds ({len(statuses) - 1})")
    used_families = set()
    for source, uses in uses_by_source:
        for name, matchers in uses.selectors:
            if name in PROMETHEUS_SERIES:
                continue
            used_families.add(family(name))
            if not check(name in samples, f"{source}: metric {name} is in /metrics"):
                continue
            labels = samples[name]
            for label, op, value in matchers:
                if label == "__name__":
                    continue
                if not check(label in labels or label in TARGET_LABELS,
                             f"{source}: {name} has label {label}", f"it has {sorted(labels)}"):
                    continue
                if label in TARGET_LABELS:
                    continue
                # Values: an exact value, or a plain alternation (a|b|c).
                if op in ("Equal", "NotEqual") or (op in ("Re", "NotRe") and re.fullmatch(r"[A-Za-z0-9_|]+", value)):
                    for v in value.split("|") if op in ("Re", "NotRe") else [value]:
                        known = v in labels[label] or (label == "status" and v in statuses)
                        check(known, f"{source}: {name}{{{label}=\"{v}\"}} is a value sluice reports",
                              f"seen: {sorted(labels[label])}" + (f"; error kinds: {sorted(statuses)}" if label == "status" else ""))
        for label, names in uses.grouping:
            if label in TARGET_LABELS:
                continue
            on = [n for n in names if n not in PROMETHEUS_SERIES]
            missing = [n for n in on if n in samples and label not in samples[n]]
            check(not missing, f"{source}: the metrics grouped by {label} have that label", ", ".join(missing))
    exported = {family(n) for n in samples if n.startswith("sluice_") or n.startswith("nv_")}
    unused = sorted(exported - used_families)
    print(f"note  sluice metric families in /metrics: {len(exported)}; not used by the dashboard or alerts: {unused or 'none'}")


def check_autoscaling(root, uses_by_source):
    """deploy/autoscaling/: the KEDA ScaledObject against KEDA's CRD, the HPA
    and the adapter's ConfigMap against Kubernetes' schemas, and every query
    they hold parses (the adapter's templates filled in as it fills them)."""
    folder = root / "deploy/autoscaling"
    docs = {}
    for path in sorted(folder.glob("*.yaml")):
        for doc in load_yaml_docs(path):
            if doc.get("apiVersion", "").startswith("keda.sh/"):
                validate_crd_object(doc, path.name, root / "tests/fixtures/keda")
            else:
                validate_core(doc, path.name)
            docs[doc.get("kind")] = doc
    queries = []
    so = docs.get("ScaledObject", {})
    check(so.get("spec", {}).get("scaleTargetRef", {}).get("name") == "sluice", "the ScaledObject scales the sluice Deployment")
    for t in so.get("spec", {}).get("triggers", []):
        check(t.get("type") == "prometheus", "the ScaledObject's trigger is KEDA's Prometheus scaler")
        queries.append(("ScaledObject trigger", t.get("metadata", {}).get("query", "")))
        check(float(t["metadata"].get("threshold", "nan")) > 0, "the trigger has a threshold")
    hpa = docs.get("HorizontalPodAutoscaler", {})
    check(hpa.get("spec", {}).get("scaleTargetRef", {}).get("name") == "sluice", "the HPA scales the sluice Deployment")
    served = set()
    cm = docs.get("ConfigMap", {})
    rules = yaml.safe_load(cm.get("data", {}).get("config.yaml", "{}")).get("rules", [])
    check(bool(rules), "the adapter's ConfigMap holds rules")
    for r in rules:
        series = r.get("seriesQuery", "")
        metric = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", series).group(0)
        served.add(r.get("name", {}).get("as"))
        queries.append((f"adapter rule {metric} seriesQuery", series))
        filled = (r.get("metricsQuery", "").replace("<<.Series>>", metric)
                  .replace("<<.LabelMatchers>>", 'namespace="default",pod=~"sluice-.*"').replace("<<.GroupBy>>", "pod"))
        queries.append((f"adapter rule {metric} metricsQuery", filled))
    for path in sorted((root / "deploy/kserve").glob("*.yaml")):
        for doc in load_yaml_docs(path):
            for m in doc.get("spec", {}).get("predictor", {}).get("autoScaling", {}).get("metrics", []):
                q = m.get("external", {}).get("metric", {}).get("query")
                if q:
                    queries.append((f"{path.name} autoScaling query", q))
    for m in hpa.get("spec", {}).get("metrics", []):
        name = m.get("pods", {}).get("metric", {}).get("name")
        check(name in served, f"the HPA's metric {name} is one the adapter's rules serve", str(sorted(served)))
    for where, q in queries:
        try:
            uses = analyse(q)
        except Exception as e:
            check(False, f"{where}: PromQL parses", f"{q}: {e}")
            continue
        check(True, f"{where}: PromQL parses")
        uses_by_source.append((where, uses))


def check_triton_dashboard(root, uses_by_source):
    """Triton's own dashboard (deploy/k8s-onprem/dashboard.json of
    triton-inference-server/server, vendored in tests/fixtures/triton/):
    every query parses, and every series it reads is one sluice serves,
    but the GPU's (nv_gpu_*: sluice reads no NVML)."""
    dash = json.loads((root / "tests/fixtures/triton/dashboard.json").read_text())
    for where, expr, _ in grafana_exprs(dash):
        try:
            uses = analyse(expr)
        except Exception as e:
            check(False, f"Triton's dashboard {where}: PromQL parses", f"{expr}: {e}")
            continue
        if any(n.startswith("nv_gpu_") for n in uses.names()):
            print(f"note  Triton's dashboard {where}: stays empty on sluice (nv_gpu_*: no NVML)")
            continue
        uses_by_source.append((f"Triton's dashboard {where}", uses))


def check_promql(root, metrics_url, extra_exprs):
    uses_by_source = []
    check_autoscaling(root, uses_by_source)
    check_triton_dashboard(root, uses_by_source)
    dash_path = root / "deploy/grafana/sluice.json"
    dash = json.loads(dash_path.read_text())
    check(dash.get("schemaVersion", 0) >= 36, f"{dash_path.name}: schemaVersion {dash.get('schemaVersion')} (Grafana 9+)")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    check(ds.get("type") == "datasource" and ds.get("query") == "prometheus", "the dashboard has a Prometheus datasource variable")
    model = variables.get("model", {})
    q = model.get("query")
    q = q.get("query") if isinstance(q, dict) else q
    m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", q or "")
    if check(m is not None and m.group(2) == "model", "the dashboard has a `model` variable from label_values(..., model)", str(q)):
        u = Uses()
        u.selectors.append((m.group(1), [("model", "Re", ".+")]))
        uses_by_source.append(("dashboard variable model", u))
    ids = []

    def all_panels(ps):
        for p in ps:
            yield p
            yield from all_panels(p.get("panels", []))

    for p in all_panels(dash.get("panels", [])):
        ids.append(p.get("id"))
        if p.get("type") != "row":
            check(p.get("datasource", {}).get("uid") == "${datasource}", f"panel {p.get('title')!r} queries ${{datasource}}")
    check(len(ids) == len(set(ids)), "the dashboard's panel ids are unique")
    exprs = grafana_exprs(dash) + [(f"--extra-expr {i}", e, "") for i, e in enumerate(extra_exprs)]
    all_text = []
    for where, expr, legend in exprs:
        try:
            uses = analyse(substitute(expr))
        except Exception as e:
            check(False, f"dashboard {where}: PromQL parses", f"{expr}: {e}")
            continue
        check(True, f"dashboard {where}: PromQL parses")
        check("model" in expr, f"dashboard {where}: is per model (uses the model label)")
        for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend):
            uses.grouping.append((label, list(uses.names())))
        uses_by_source.append((f"dashboard {where}", uses))
        all_text.append(expr)
    joined = "\n".join(all_text)
    for what, pattern in [
        ("p50 queue delay", r"histogram_quantile\(0\.5, [^\n]*sluice_queue_delay_seconds_bucket"),
        ("p99 queue delay", r"histogram_quantile\(0\.99, [^\n]*sluice_queue_delay_seconds_bucket"),
        ("the batch-size distribution", r"sluice_batch_size_bucket"),
        ("requests by status", r"by \([^)]*status[^)]*\) \(rate\(sluice_requests_total"),
        ("queue depth", r"sluice_queue_size"),
        ("reload failures", r'sluice_model_reloads_total\{[^}]*result="failed"'),
        ("readiness", r"sluice_model_ready"),
        ("inference duration", r"sluice_inference_duration_seconds_bucket"),
        ("request duration p99", r"histogram_quantile\(0\.99, [^\n]*sluice_request_duration_seconds_bucket"),
        ("batches by trigger", r"by \([^)]*trigger[^)]*\) \(rate\(sluice_batches_total"),
    ]:
        check(re.search(pattern, joined) is not None, f"the dashboard shows {what}")

    alerts_path = root / "deploy/prometheus/alerts.yaml"
    rules_doc = yaml.safe_load(alerts_path.read_text())
    groups = rules_doc.get("groups", []) if isinstance(rules_doc, dict) else []
    check(bool(groups) and set(rules_doc) == {"groups"}, f"{alerts_path.name} is a Prometheus rules file (groups:)")
    names = []
    duration = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
    for g in groups:
        check(set(g) <= {"name", "rules", "interval", "limit", "labels", "query_offset"} and g.get("name"),
              f"rule group {g.get('name')!r} has only rule-group fields")
        for r in g.get("rules", []):
            name = r.get("alert") or r.get("record")
            names.append(name)
            where = f"alert {name}"
            check(set(r) <= {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"},
                  f"{where}: only rule fields", str(sorted(r)))
            check("for" not in r or duration.match(str(r["for"])) is not None, f"{where}: `for` is a duration", str(r.get("for")))
            check(r.get("labels", {}).get("severity") in {"critical", "warning", "info"}, f"{where}: has a severity")
            ann = r.get("annotations", {})
            check(bool(ann.get("summary")) and bool(ann.get("description")), f"{where}: has a summary and a description")
            try:
                uses = analyse(r["expr"])
            except Exception as e:
                check(False, f"{where}: PromQL parses", f"{r.get('expr')}: {e}")
                continue
            check(True, f"{where}: PromQL parses")
            for label in set(re.findall(r"\$labels\.(\w+)", json.dumps(ann))):
                uses.grouping.append((label, list(uses.names())))
            uses_by_source.append((where, uses))
    check(len(names) == len(set(names)), "alert names are unique")
    alert_metrics = {family(n) for _, u in uses_by_source if _.startswith("alert ") for n in u.names()}
    for metric in ["sluice_model_ready", "sluice_model_reloads_total", "sluice_queue_size",
                   "sluice_queue_delay_seconds", "sluice_requests_total", "sluice_requests_dropped_total", "up"]:
        check(metric in alert_metrics, f"an alert watches {metric}")

    if metrics_url:
        with urllib.request.urlopen(metrics_url, timeout=30) as r:
            text = r.read().decode()
        samples = parse_exposition(text)
        check(bool(samples), f"{metrics_url} answers Prometheus text ({len(samples)} sample names)")
        check_metrics(uses_by_source, samples, root)
    else:
        print("note  no --metrics-url: metric names not checked against a running server")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    ap.add_argument("--metrics-url", help="a running sluice's /metrics")
    ap.add_argument("--extra-expr", action="append", default=[], help="one more PromQL expression to check")
    ap.add_argument("--write-config", metavar="FILE", help="write the ConfigMap's sluice.toml there")
    a = ap.parse_args()
    root = a.root
    fixtures = root / "tests/fixtures/kserve"

    k8s = []
    for path in sorted((root / "deploy/k8s").glob("*.yaml")):
        for doc in load_yaml_docs(path):
            validate_core(doc, path.name)
            k8s.append(doc)
    check_k8s(k8s, "deploy/k8s", root, a.write_config)

    kserve = []
    for path in sorted((root / "deploy/kserve").glob("*.yaml")):
        for doc in load_yaml_docs(path):
            validate_crd_object(doc, path.name, fixtures)
            kserve.append(doc)
    check_kserve(kserve, "deploy/kserve")

    check_promql(root, a.metrics_url, a.extra_expr)

    print(f"manifests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
