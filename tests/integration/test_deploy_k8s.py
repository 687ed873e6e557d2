"""The Kubernetes manifests in scripts/deploy/k8s.

Schema: every object validates (strict: no unknown fields) against the Kubernetes version
the manifests target and the oldest they support, with kubernetes-validate's bundled
schemas (offline); KEDA's ScaledObject against a schema of our own (SCALED_OBJECT_SCHEMA).
Semantics: container args parse with the real worker and edge CLIs, the probes and
Prometheus annotations hit the ports those args open, grace periods cover the drains,
every container requests resources, selectors match labels, references resolve, the
proxies in front wait at least as long as a generation may take, and the worker
autoscalers act on a gauge the worker serves. One test runs the real edge with the
manifest's kind of worker address.
"""

from __future__ import annotations

import re
import shlex
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import kubernetes_validate
import pytest
import yaml

from edge.config import EdgeConfig
from edge.config import build_parser as edge_parser
from edge.config import config_from_args as edge_config
from model_service.config import WorkerConfig
from model_service.config import build_parser as worker_parser
from model_service.config import config_from_args as worker_config
from scripts.deploy.render_nginx import NginxParams
from tests.procs import ROOT, start_edge, start_worker
from tests.waits import eventually

K8S = ROOT / "scripts" / "deploy" / "k8s"
# Written for 1.31; 1.27 is the oldest supported (native gRPC probes are GA there).
KUBERNETES_VERSIONS = ("1.27.0", "1.31.0")
# Kept out of the kustomization on purpose: applying the Secret would blank the real keys;
# the canary is applied for a gray release only (its header documents the sequence).
# The worker autoscalers are alternatives (KEDA, or an HPA on an external metric), applied
# by hand once what they need is installed.
NOT_APPLIED = {"edge-secret.yaml", "worker-canary.yaml", "worker-keda.yaml", "worker-hpa.yaml"}
MARGIN_S = 5  # at least this much between the drain's end and the kubelet's SIGKILL


def load() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


DOCS = load()


def objects(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in DOCS if d["kind"] == kind]


def obj(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in objects(kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def pod(deployment: str) -> dict[str, Any]:
    return obj("Deployment", deployment)["spec"]["template"]


def container(deployment: str) -> dict[str, Any]:
    (c,) = pod(deployment)["spec"]["containers"]
    return c


def namespace() -> str:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())["namespace"]


def env_values(c: dict[str, Any]) -> dict[str, str]:
    """Each env var's value, ConfigMap references resolved from our own ConfigMaps."""
    values = {}
    for e in c.get("env", []):
        if "value" in e:
            values[e["name"]] = e["value"]
        elif ref := e.get("valueFrom", {}).get("configMapKeyRef"):
            values[e["name"]] = obj("ConfigMap", ref["name"])["data"][ref["key"]]
    return values


def args(c: dict[str, Any]) -> list[str]:
    """The container's args as the kubelet passes them: $(VAR) expanded."""
    env = env_values(c)
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]


def port_number(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in c["ports"] if p["name"] == port)


def console_script(name: str) -> str:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return pyproject["project"]["scripts"][name]


def worker_cfg() -> WorkerConfig:
    c = container("sluice-worker")
    assert c["command"] == ["sluice-worker"]
    assert console_script("sluice-worker") == "model_service.__main__:main"
    return worker_config(worker_parser().parse_args(args(c)))


def edge_cfg() -> EdgeConfig:
    c = container("sluice-edge")
    assert c["command"] == ["sluice-edge"]
    assert console_script("sluice-edge") == "edge.__main__:main"
    return edge_config(edge_parser().parse_args(args(c)))


def size_bytes(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([kKmMgG]?)", text).groups()  # type: ignore[union-attr]
    return int(number) << {"": 0, "k": 10, "m": 20, "g": 30}[unit.lower()]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(version):
    assert len(DOCS) >= 10
    for name, doc in DOCS:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # a custom resource: test_the_keda_scaled_object_validates...
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{name} ({doc['kind']}) at {version}: {err.message}")


def test_kustomization_applies_every_manifest():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == files - NOT_APPLIED
    assert all(d["metadata"].get("namespace") in (None, namespace()) for _, d in DOCS)


def test_selectors_match_pod_labels():
    deployments = objects("Deployment")
    assert {d["metadata"]["name"] for d in deployments} == {
        "sluice-worker",
        "sluice-worker-canary",
        "sluice-edge",
        "sluice-redis",
    }
    for d in deployments:
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"].items() <= labels.items()

    def selected(selector: dict[str, str]) -> list[str]:
        return [
            d["metadata"]["name"]
            for d in deployments
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]

    for svc in objects("Service"):
        assert len(selected(svc["spec"]["selector"])) == 1, svc["metadata"]["name"]
    for pdb in objects("PodDisruptionBudget"):
        assert len(selected(pdb["spec"]["selector"]["matchLabels"])) == 1
    for hpa in objects("HorizontalPodAutoscaler"):
        obj("Deployment", hpa["spec"]["scaleTargetRef"]["name"])


def test_every_container_requests_cpu_and_memory_and_the_worker_one_gpu():
    for d in objects("Deployment"):
        for c in d["spec"]["template"]["spec"]["containers"]:
            requests = c["resources"]["requests"]
            assert {"cpu", "memory"} <= requests.keys(), c["name"]
            assert "memory" in c["resources"].get("limits", {}), c["name"]
    res = container("sluice-worker")["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == 1


def test_worker_args_parse_and_probes_and_metrics_hit_the_ports_they_open():
    cfg = worker_cfg()
    c = container("sluice-worker")
    server = cfg.server
    assert cfg.engine.engine == "vllm" and cfg.engine.model.startswith("/models/")
    assert server.host == "0.0.0.0", "the kubelet and Prometheus connect to the pod IP"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {
        "grpc": server.port,
        "health": server.health_port,
        "metrics": server.metrics_port,
    }
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c[kind]
        assert probe["grpc"]["port"] == server.health_port, kind  # the plaintext port
    annotations = pod("sluice-worker")["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(server.metrics_port)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert cfg.engine.model.startswith(mounts["models"] + "/")
    for path in (server.tls_cert, server.tls_key, server.tls_client_ca):
        assert not path or path.startswith(mounts["tls"] + "/")


def test_worker_grace_covers_the_drain_and_liveness_never_kills_a_draining_worker():
    cfg = worker_cfg()
    spec = pod("sluice-worker")["spec"]
    c = container("sluice-worker")
    drain = cfg.server.drain_grace_s
    assert spec["terminationGracePeriodSeconds"] >= drain + MARGIN_S
    live = c["livenessProbe"]
    # NOT_SERVING while draining fails the probe: the failures must outlast the drain.
    assert live["periodSeconds"] * live["failureThreshold"] >= drain
    start = c["startupProbe"]
    assert start["periodSeconds"] * start["failureThreshold"] >= 300  # loading weights


def test_worker_service_is_headless_on_the_grpc_port():
    svc = obj("Service", "sluice-worker")["spec"]
    assert svc["clusterIP"] == "None"
    assert not svc.get("publishNotReadyAddresses", False)
    (port,) = svc["ports"]
    c = container("sluice-worker")
    assert port_number(c, port["targetPort"]) == port["port"] == worker_cfg().server.port


def test_edge_args_parse_and_probes_hit_its_port_and_it_targets_the_worker_service():
    cfg = edge_cfg()
    c = container("sluice-edge")
    assert cfg.server.host == "0.0.0.0"
    assert port_number(c, c["readinessProbe"]["httpGet"]["port"]) == cfg.server.port
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert port_number(c, c["livenessProbe"]["httpGet"]["port"]) == cfg.server.port
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod("sluice-edge")["metadata"]["annotations"]["prometheus.io/port"] == str(
        cfg.server.port
    )
    svc = obj("Service", "sluice-worker")
    port = svc["spec"]["ports"][0]["port"]
    expected = f"dns:///{svc['metadata']['name']}.{namespace()}.svc.cluster.local:{port}"
    assert cfg.routing.workers == [expected]
    edge_svc = obj("Service", "sluice-edge")["spec"]["ports"][0]
    assert port_number(c, edge_svc["targetPort"]) == cfg.server.port


def test_edge_grace_covers_prestop_and_drain():
    cfg = edge_cfg()
    c = container("sluice-edge")
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    # The sleep must outlast endpoint removal, yet stay under the readiness window.
    assert 1 <= pre_stop <= 15
    grace = pod("sluice-edge")["spec"]["terminationGracePeriodSeconds"]
    assert grace >= pre_stop + cfg.server.drain_grace_s + MARGIN_S


def test_config_and_secret_references_resolve():
    for d in objects("Deployment"):
        spec = d["spec"]["template"]["spec"]
        for c in spec["containers"]:
            for e in c.get("env", []):
                source = e.get("valueFrom", {})
                if ref := source.get("configMapKeyRef"):
                    assert ref["key"] in obj("ConfigMap", ref["name"])["data"]
                if ref := source.get("secretKeyRef"):
                    assert ref.get("optional") is True, "applied Secrets are never in git"
                    assert ref["key"] in obj("Secret", ref["name"])["stringData"]
            mounted = {m["name"] for m in c.get("volumeMounts", [])}
            assert mounted <= {v["name"] for v in spec.get("volumes", [])}
        for v in spec.get("volumes", []):
            if "secret" in v:
                assert v["secret"].get("optional") is True, v["name"]


def test_proxies_wait_as_long_as_a_generation_may_take():
    cfg = edge_cfg()
    ingress = obj("Ingress", "sluice-edge")["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    nginx = NginxParams(prefix=Path("."), tls_cert="", tls_key="", edges=[], workers=[])
    for read_timeout, body, where in (
        (float(ingress[prefix + "proxy-read-timeout"]), ingress[prefix + "proxy-body-size"], "ing"),
        (nginx.read_timeout_s, nginx.max_body, "render_nginx.py defaults"),
    ):
        assert read_timeout >= cfg.stream.request_timeout_s, where
        assert cfg.stream.heartbeat_s * 2 <= read_timeout, where
        assert size_bytes(body) >= cfg.server.max_body_bytes, where
    assert ingress[prefix + "proxy-buffering"] == "off"
    assert "non_idempotent" not in ingress[prefix + "proxy-next-upstream"]


def test_the_canary_is_the_stable_worker_but_for_its_version_and_is_reached_apart():
    stable, canary = pod("sluice-worker"), pod("sluice-worker-canary")
    c = container("sluice-worker-canary")
    cfg = worker_config(worker_parser().parse_args(args(c)))
    assert cfg.engine.model_name == worker_cfg().engine.model_name  # clients see one model
    assert cfg.engine.version and cfg.engine.version != worker_cfg().engine.version
    # The same pod but for the labels, image, and version flag: probes, ports, grace,
    # resources and volumes cannot drift apart.
    swapped = yaml.safe_load(
        yaml.safe_dump(stable).replace("component: worker\n", "component: worker-canary\n")
    )
    swapped["spec"]["containers"][0]["image"] = c["image"]
    swapped["spec"]["containers"][0]["args"] = [
        a for a in c["args"] if not a.startswith("--model-version")
    ]
    expected = {**canary, "spec": {**canary["spec"]}}
    expected["spec"]["containers"] = [{**c, "args": swapped["spec"]["containers"][0]["args"]}]
    assert swapped == expected
    assert c["image"] != container("sluice-worker")["image"]
    svc = obj("Service", "sluice-worker-canary")["spec"]
    assert svc["clusterIP"] == "None"
    assert svc["selector"].items() <= canary["metadata"]["labels"].items()
    assert not svc["selector"].items() <= stable["metadata"]["labels"].items()
    # The documented sequence: its CLI call parses and names this Service and port.
    from scripts import rollout

    header = (K8S / "worker-canary.yaml").read_text().split("apiVersion")[0]
    lines = [ln.lstrip("#").strip() for ln in header.splitlines()]
    start = next(i for i, ln in enumerate(lines) if "python -m scripts.rollout" in ln)
    command = ""
    for ln in lines[start:]:
        command += " " + ln.rstrip("\\")
        if not ln.endswith("\\"):
            break
    argv = shlex.split(command.split("python -m scripts.rollout", 1)[1])
    parsed = rollout.parse_args(argv)
    port = svc["ports"][0]["port"]
    assert parsed.command == "run" and parsed.canary == "canary"
    target = f"dns:///sluice-worker-canary.{namespace()}.svc.cluster.local:{port}"
    assert parsed.worker == [target]
    assert port == cfg.server.port
    # One edge of the fleet, through its Service: the plan runs for all of them.
    edge_svc = obj("Service", "sluice-edge")
    (edge_port,) = edge_svc["spec"]["ports"]
    host = f"{edge_svc['metadata']['name']}.{namespace()}.svc.cluster.local"
    assert parsed.edge == [
        f"http://{host}" if edge_port["port"] == 80 else f"http://{host}:{edge_port['port']}"
    ]
    assert edge_cfg().session.secure  # TLS ends at the ingress: the cookie is Secure


def test_every_edge_replica_shares_the_redis_the_manifests_run():
    """--store-url names the Redis Service by its cluster DNS name and port, the Service
    selects the Redis pod and targets the port redis-server listens on; Redis keeps
    nothing on disk and stays under its memory limit."""
    cfg = edge_cfg()
    url = urllib.parse.urlsplit(cfg.store.url)
    svc = obj("Service", "sluice-redis")
    (port,) = svc["spec"]["ports"]
    assert (url.scheme, url.hostname, url.port, url.path) == (
        "redis",
        f"{svc['metadata']['name']}.{namespace()}.svc.cluster.local",
        port["port"],
        "/0",
    )
    c = container("sluice-redis")
    assert c["command"] == ["redis-server"]
    flags = dict(zip(c["args"][::2], c["args"][1::2], strict=True))
    assert port_number(c, port["targetPort"]) == int(flags["--port"])
    assert c["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]  # default port
    assert port_number(c, c["livenessProbe"]["tcpSocket"]["port"]) == int(flags["--port"])
    assert (flags["--save"], flags["--appendonly"]) == ("", "no")
    assert size_bytes(flags["--maxmemory"].removesuffix("b")) < size_bytes(
        c["resources"]["limits"]["memory"].removesuffix("i")
    )
    assert flags["--maxmemory-policy"] == "volatile-lru"  # control and rollouts: no ttl
    spec = obj("Deployment", "sluice-redis")["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    assert cfg.store.failure == "open"  # a Redis restart never refuses traffic


def test_the_edge_scales_on_cpu_between_its_bounds():
    hpa = obj("HorizontalPodAutoscaler", "sluice-edge")
    assert hpa["apiVersion"] == "autoscaling/v2"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "sluice-edge",
    }
    assert 2 <= spec["minReplicas"] <= spec["maxReplicas"]
    ((metric),) = spec["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert 0 < metric["resource"]["target"]["averageUtilization"] <= 100
    assert "replicas" not in obj("Deployment", "sluice-edge")["spec"]  # the HPA owns it
    assert container("sluice-edge")["resources"]["requests"]["cpu"]  # utilization's base
    assert edge_cfg().server.processes == 1  # one process per pod: the HPA counts pods


def strict_object(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    """An object that takes only the listed properties, as the API server's strict field
    validation treats an object KEDA's CRD lists the properties of."""
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    return {**schema, "required": list(required)} if required else schema


INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
SCALING_RULES = strict_object(
    {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "tolerance": {"type": ["string", "number"]},
        "policies": {
            "type": "array",
            "items": strict_object(
                {
                    "type": {"enum": ["Pods", "Percent"]},
                    "value": {"type": "integer", "exclusiveMinimum": 0},
                    "periodSeconds": {"type": "integer", "exclusiveMinimum": 0, "maximum": 1800},
                },
                "type",
                "value",
                "periodSeconds",
            ),
        },
    }
)
# Written by us (not copied from KEDA's repository) after the ScaledObject fields KEDA
# documents (keda.sh/docs, "Scaling Deployments, StatefulSets & Custom Resources" and the
# Prometheus scaler), for keda.sh/v1alpha1. Strict (additionalProperties false) wherever
# KEDA's CRD lists an object's properties; metadata and trigger metadata stay open maps.
SCALED_OBJECT_SCHEMA: dict[str, Any] = strict_object(
    {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "namespace": {"type": "string"},
                "labels": STRINGS,
                "annotations": STRINGS,
            },
            "required": ["name"],
        },
        "spec": strict_object(
            {
                "scaleTargetRef": strict_object(
                    {
                        "name": {"type": "string"},
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                    "name",
                ),
                "pollingInterval": INT32,
                "cooldownPeriod": INT32,
                "initialCooldownPeriod": INT32,
                "idleReplicaCount": INT32,
                "minReplicaCount": INT32,
                "maxReplicaCount": INT32,
                "fallback": strict_object(
                    {
                        "failureThreshold": INT32,
                        "replicas": INT32,
                        "behavior": {
                            "enum": [
                                "static",
                                "currentReplicas",
                                "currentReplicasIfHigher",
                                "currentReplicasIfLower",
                                "scalingModifiers",
                            ]
                        },
                    },
                    "failureThreshold",
                    "replicas",
                ),
                "advanced": strict_object(
                    {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": strict_object(
                            {
                                "name": {"type": "string"},
                                "behavior": strict_object(
                                    {"scaleUp": SCALING_RULES, "scaleDown": SCALING_RULES}
                                ),
                            }
                        ),
                        "scalingModifiers": strict_object(
                            {
                                "formula": {"type": "string"},
                                "target": {"type": "string"},
                                "activationTarget": {"type": "string"},
                                "metricType": {"enum": ["AverageValue", "Value"]},
                            }
                        ),
                    }
                ),
                "triggers": {
                    "type": "array",
                    "items": {
                        **strict_object(
                            {
                                "type": {"type": "string"},
                                "name": {"type": "string"},
                                "metadata": STRINGS,
                                "authenticationRef": strict_object(
                                    {
                                        "name": {"type": "string"},
                                        "kind": {
                                            "enum": [
                                                "TriggerAuthentication",
                                                "ClusterTriggerAuthentication",
                                            ]
                                        },
                                    },
                                    "name",
                                ),
                                "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                                "useCachedMetrics": {"type": "boolean"},
                            },
                            "type",
                            "metadata",
                        ),
                        # The Prometheus scaler needs where to ask, what, and the target.
                        "if": {"properties": {"type": {"const": "prometheus"}}},
                        "then": {
                            "properties": {
                                "metadata": {"required": ["serverAddress", "query", "threshold"]}
                            }
                        },
                    },
                },
            },
            "scaleTargetRef",
            "triggers",
        ),
        "status": {"type": "object"},
    },
    "apiVersion",
    "kind",
    "metadata",
    "spec",
)


def test_the_keda_scaled_object_validates_and_bad_ones_are_refused():
    jsonschema.Draft202012Validator.check_schema(SCALED_OBJECT_SCHEMA)
    so = obj("ScaledObject", "sluice-worker")
    jsonschema.validate(so, SCALED_OBJECT_SCHEMA)
    bad = {**so, "spec": {**so["spec"], "minReplicas": 2}}  # the HPA's spelling, not KEDA's
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCALED_OBJECT_SCHEMA)
    (trigger,) = so["spec"]["triggers"]
    meta = {k: v for k, v in trigger["metadata"].items() if k != "query"}
    no_query = {**so, "spec": {**so["spec"], "triggers": [{**trigger, "metadata": meta}]}}
    with pytest.raises(jsonschema.ValidationError, match="'query' is a required property"):
        jsonschema.validate(no_query, SCALED_OBJECT_SCHEMA)


def worker_metric_names() -> set[str]:
    """The names the worker's /metrics serves (a real scrape of WorkerMetrics)."""
    from prometheus_client import generate_latest

    from model_service.obs.metrics import WorkerMetrics
    from model_service.types import WorkerFigures

    m = WorkerMetrics()
    m.watch(lambda: WorkerFigures(True, False, None, 0, 0, 0, 0, 0, 0, 0, 0))
    text = generate_latest(m.registry).decode()
    return {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")}


def test_workers_scale_on_the_queue_depth_they_export_with_keda_or_an_hpa():
    """Both autoscalers target the worker Deployment on the gauge the worker serves, with
    the same bounds and the same per-worker target, never below the PDB's room."""
    so, hpa = obj("ScaledObject", "sluice-worker"), obj("HorizontalPodAutoscaler", "sluice-worker")
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "sluice-worker"}
    assert so["spec"]["scaleTargetRef"] == hpa["spec"]["scaleTargetRef"] == target
    obj("Deployment", "sluice-worker")
    names = worker_metric_names()
    assert "sluice_worker_queue_depth" in names
    assert "sluice_worker_generation_tokens_per_second" in names
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert set(meta) == {"serverAddress", "query", "threshold"}
    assert re.fullmatch(r"sum\(sluice_worker_queue_depth\{namespace=\"(\w+)\"\}\)", meta["query"])
    assert f'namespace="{namespace()}"' in meta["query"]
    assert urllib.parse.urlsplit(meta["serverAddress"]).scheme in ("http", "https")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == "sluice_worker_queue_depth"
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"namespace": namespace()}
    assert metric["external"]["target"] == {
        "type": "AverageValue",
        "averageValue": meta["threshold"],
    }
    assert float(meta["threshold"]) > 0
    # Never to zero (a GPU worker takes minutes to start), same bounds both ways.
    low, high = so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]
    assert (low, high) == (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"])
    assert 1 <= low <= high
    behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == hpa["spec"]["behavior"]
    # Scaling down waits longer than a worker's drain takes.
    grace = pod("sluice-worker")["spec"]["terminationGracePeriodSeconds"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] > grace


@pytest.mark.slow
def test_the_edge_reaches_workers_by_a_dns_target_like_the_manifest(tmp_path: Path):
    """The manifest names workers as dns:///SERVICE:PORT; the real edge must take that
    form. Here the name is localhost (the worker listens on 127.0.0.1)."""
    manifest_target = edge_cfg().routing.workers[0]
    assert manifest_target.startswith("dns:///")
    worker = start_worker("--engine", "sim", "--sim-token-delay", "0")
    try:
        edge = start_edge("--worker", f"dns:///localhost:{worker.port}")
        try:
            base = f"http://{edge.address}"
            eventually(
                lambda: httpx.get(base + "/readyz").status_code == 200,
                what="the edge is ready",
                timeout=20,
                detail=edge.log,
            )
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            resp = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["completion_tokens"] == 3
        finally:
            edge.terminate(10)
    finally:
        worker.terminate(10)
