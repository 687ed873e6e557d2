"""The manifests for models bigger than one GPU, scripts/deploy/k8s-multigpu.

Schema: built-in objects validate strictly with kubernetes-validate's bundled schemas, at
the versions the main manifests target; the LeaderWorkerSet (a CRD, whose schema that
package does not have) is checked field by field against the LWS v1 API, and its two pod
templates validate strictly as core PodTemplates. Semantics: the worker's args parse with
the real CLI and pass its parallelism checks, the GPUs asked for equal the ranks vLLM will
start, probes hit the health port, grace covers the drain, Services select the serving
pods (LWS: leaders only), and the Ray nodes join the leader's head.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from model_service.config import WorkerConfig, build_parser, config_from_args
from model_service.engines.vllm.parallel import Node, check
from tests.integration.test_deploy_k8s import KUBERNETES_VERSIONS, MARGIN_S
from tests.procs import ROOT

DIR = ROOT / "scripts" / "deploy" / "k8s-multigpu"
# LeaderWorkerSet v1 (leaderworkerset.x-k8s.io): the fields of each level we may use.
LWS_SPEC = {"replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy",
            "networkConfig"}  # fmt: skip
LWS_TEMPLATE = {"leaderTemplate", "workerTemplate", "size", "restartPolicy",
                "subGroupPolicy"}  # fmt: skip
LWS_ROLLOUT = {"type", "rollingUpdateConfiguration"}
LWS_RESTART = {"RecreateGroupOnPodRestart", "None"}
LWS_STARTUP = {"LeaderCreated", "LeaderReady"}


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DIR / name).read_text()) if d]


def one(name: str, kind: str) -> dict[str, Any]:
    (d,) = [d for d in docs(name) if d["kind"] == kind]
    return d


def worker_args(c: dict[str, Any]) -> list[str]:
    """The sluice-worker arguments of a container: its args, or the part of its `sh -c`
    script after `exec sluice-worker`."""
    if c["command"] == ["sluice-worker"]:
        return list(c["args"])
    assert c["command"] == ["sh", "-c"]
    script = c["args"][0]
    words = shlex.split(script.split("exec sluice-worker", 1)[1])
    return words


def cfg(c: dict[str, Any]) -> WorkerConfig:
    return config_from_args(build_parser().parse_args(worker_args(c)))


def gpus(c: dict[str, Any]) -> int:
    res = c["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"]
    return int(res["limits"]["nvidia.com/gpu"])


def validate(doc: dict[str, Any], where: str) -> None:
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{where} at {version}: {err.message}")


def check_serving_pod(template: dict[str, Any], where: str) -> WorkerConfig:
    """Probes on the health port, grace over the drain, ports as the args open them."""
    (c,) = template["spec"]["containers"]
    config = cfg(c)
    server = config.server
    assert config.engine.engine == "vllm" and config.engine.model.startswith("/models/")
    assert server.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert {k: ports[k] for k in ("grpc", "health", "metrics")} == {
        "grpc": server.port,
        "health": server.health_port,
        "metrics": server.metrics_port,
    }, where
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[kind]["grpc"]["port"] == server.health_port, (where, kind)
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= server.drain_grace_s, where
    grace = template["spec"]["terminationGracePeriodSeconds"]
    assert grace >= server.drain_grace_s + MARGIN_S, where
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(server.metrics_port), where
    return config


def selects(service: dict[str, Any], labels: dict[str, str]) -> bool:
    return service["spec"]["selector"].items() <= labels.items()


def test_builtin_objects_validate_against_the_kubernetes_schema() -> None:
    for name in ("worker-tp.yaml", "worker-lws.yaml"):
        for d in docs(name):
            if d["kind"] != "LeaderWorkerSet":
                validate(d, f"{name} {d['kind']}")


def test_tensor_parallel_worker_asks_for_the_gpus_its_ranks_use() -> None:
    deployment = one("worker-tp.yaml", "Deployment")
    template = deployment["spec"]["template"]
    config = check_serving_pod(template, "worker-tp")
    v = config.engine.vllm
    (c,) = template["spec"]["containers"]
    ranks = v.tensor_parallel_size * v.pipeline_parallel_size * v.data_parallel_size
    assert ranks > 1 and gpus(c) == ranks
    assert v.distributed_executor_backend == "mp"
    check(v, Node(gpus=gpus(c), cpus=int(c["resources"]["requests"]["cpu"]), ray=False))
    labels = template["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one("worker-tp.yaml", "Service")
    assert service["spec"]["clusterIP"] == "None" and selects(service, labels)
    # Apart from the one-GPU workers' Deployment and Service: no pod claimed twice.
    main = yaml.safe_load((ROOT / "scripts/deploy/k8s/worker-deployment.yaml").read_text())
    assert not main["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["ports"][0]["port"] == config.server.port


def test_leader_worker_set_fields_are_lws_v1_and_its_pod_templates_validate() -> None:
    lws = one("worker-lws.yaml", "LeaderWorkerSet")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert set(lws) == {"apiVersion", "kind", "metadata", "spec"}
    spec = lws["spec"]
    assert set(spec) <= LWS_SPEC, set(spec) - LWS_SPEC
    assert spec["startupPolicy"] in LWS_STARTUP
    assert set(spec["rolloutStrategy"]) <= LWS_ROLLOUT
    tpl = spec["leaderWorkerTemplate"]
    assert set(tpl) <= LWS_TEMPLATE, set(tpl) - LWS_TEMPLATE
    assert tpl["restartPolicy"] in LWS_RESTART
    assert isinstance(tpl["size"], int) and tpl["size"] >= 2
    for key in ("leaderTemplate", "workerTemplate"):
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"lws-{key.lower()}", "namespace": "sluice"},
            "template": tpl[key],
        }
        validate(pod_template, f"worker-lws.yaml {key}")


def test_leader_worker_set_gpus_cover_every_rank_and_ray_joins_the_leader() -> None:
    lws = one("worker-lws.yaml", "LeaderWorkerSet")
    tpl = lws["spec"]["leaderWorkerTemplate"]
    leader = tpl["leaderTemplate"]
    config = check_serving_pod(leader, "lws leader")
    v = config.engine.vllm
    assert v.distributed_executor_backend == "ray"
    (lc,) = leader["spec"]["containers"]
    (wc,) = tpl["workerTemplate"]["spec"]["containers"]
    per_pod = gpus(lc)
    assert gpus(wc) == per_pod
    assert per_pod * tpl["size"] == v.tensor_parallel_size * v.pipeline_parallel_size
    check(v, Node(gpus=per_pod, cpus=32, ray=True))
    head = lc["args"][0]
    ray_port = next(p["containerPort"] for p in lc["ports"] if p["name"] == "ray")
    assert f"ray start --head --port={ray_port}" in head
    assert f"--num-gpus={per_pod}" in head and f"--num-gpus={per_pod}" in wc["args"][0]
    joined = re.fullmatch(r"ray start --address=\$\(LWS_LEADER_ADDRESS\):(\d+) .*--block",
                          wc["args"][0])  # fmt: skip
    assert joined and int(joined.group(1)) == ray_port
    env = {e["name"]: e["value"] for e in lc["env"]}
    assert env["RAY_ADDRESS"] == f"127.0.0.1:{ray_port}"
    service = one("worker-lws.yaml", "Service")
    assert selects(service, leader["metadata"]["labels"])
    assert not selects(service, tpl["workerTemplate"]["metadata"]["labels"])
    assert service["spec"]["ports"][0]["port"] == config.server.port


def test_the_multi_gpu_manifests_stay_out_of_the_default_kustomization() -> None:
    main = yaml.safe_load((ROOT / "scripts/deploy/k8s/kustomization.yaml").read_text())
    assert not any("multigpu" in r for r in main["resources"])
    assert {p.name for p in DIR.iterdir()} == {"worker-tp.yaml", "worker-lws.yaml"}


def test_readme_names_both_layouts() -> None:
    readme = (ROOT / "README.md").read_text()
    for needle in ("k8s-multigpu/worker-tp.yaml", "k8s-multigpu/worker-lws.yaml"):
        assert needle in readme
    assert Path(DIR).is_dir()
