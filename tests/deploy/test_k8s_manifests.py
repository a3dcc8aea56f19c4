"""The Kubernetes manifests agree with each other and with the node's flags, ports and probes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from raftq.node.cli import build_parser
from raftq.node.local import LocalRaft

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def load() -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                docs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return docs


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Any]]:
    return load()


def container(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    [c] = docs["StatefulSet/raftq"]["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = c
    return result


def env(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(docs)["env"]}


def node_help() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    choices: Any = sub.choices
    return str(choices["node"].format_help())


def test_every_manifest_is_listed_in_the_kustomization() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files


def test_statefulset_runs_three_members_behind_a_headless_service(docs: dict[str, Any]) -> None:
    sts = docs["StatefulSet/raftq"]
    headless = docs[f"Service/{sts['spec']['serviceName']}"]
    assert sts["spec"]["replicas"] == 3
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for svc in ("Service/raftq", f"Service/{sts['spec']['serviceName']}"):
        assert docs[svc]["spec"]["selector"].items() <= labels.items()
    assert docs["PodDisruptionBudget/raftq"]["spec"]["selector"]["matchLabels"].items() <= (
        labels.items()
    )


def test_every_env_var_is_a_node_option(docs: dict[str, Any]) -> None:
    help_text = node_help()
    for name in env(docs):
        assert f"[{name}]" in help_text, f"{name} is not an option of `raftq node`"


def test_ports_match_the_listen_raft_and_advertise_addresses(docs: dict[str, Any]) -> None:
    e = env(docs)
    ports = {p["name"]: p["containerPort"] for p in container(docs)["ports"]}
    assert e["RAFTQ_LISTEN"].endswith(f":{ports['http']}")
    assert e["RAFTQ_RAFT"].endswith(f":{ports['raft']}")
    assert e["RAFTQ_ADVERTISE"].endswith(f":{ports['http']}")
    svc_ports = {p["name"]: p["targetPort"] for p in docs["Service/raftq"]["spec"]["ports"]}
    assert svc_ports == {"http": "http"}


def test_peers_name_every_replica_by_its_stable_dns_name(docs: dict[str, Any]) -> None:
    sts = docs["StatefulSet/raftq"]
    peers = env(docs)["RAFTQ_PEERS"].split(",")
    names = [f"raftq-{i}" for i in range(sts["spec"]["replicas"])]
    pattern = re.compile(r"([\w-]+)=([\w.-]+):9000/([\w.-]+):8000")
    parsed = [pattern.fullmatch(p) for p in peers]
    assert all(parsed), peers
    assert [m.group(1) for m in parsed if m] == names
    for m in parsed:
        assert m is not None
        assert m.group(2) == m.group(3) == f"{m.group(1)}.{sts['spec']['serviceName']}"


def test_secret_and_volume_references_resolve(docs: dict[str, Any]) -> None:
    # The secret and the admin token come from a file the operator creates (never a committed
    # placeholder), through the one generated Secret.
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    [gen] = kust["secretGenerator"]
    assert gen["envs"] == ["secret.env"] and not (K8S / "secret.env").exists()
    assert kust["generatorOptions"]["disableNameSuffixHash"]
    for var, key in (("RAFTQ_SECRET", "secret"), ("RAFTQ_ADMIN_TOKEN", "admin-token")):
        ref = env(docs)[var]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (gen["name"], key), var
        assert f"{key}=" in (K8S / "kustomization.yaml").read_text()  # (how to write it)
    mounts = {m["name"]: m["mountPath"] for m in container(docs)["volumeMounts"]}
    claims = [
        c["metadata"]["name"] for c in docs["StatefulSet/raftq"]["spec"]["volumeClaimTemplates"]
    ]
    assert mounts[claims[0]] == env(docs)["RAFTQ_DATA_DIR"]


def test_the_admin_token_comes_from_the_secret_and_nowhere_else(docs: dict[str, Any]) -> None:
    c = container(docs)
    admin = [e for e in c["env"] if e["name"] in ("RAFTQ_ADMIN_TOKEN", "RAFTQ_ADMIN_TOKEN_FILE")]
    assert [e["name"] for e in admin] == ["RAFTQ_ADMIN_TOKEN"]
    assert "value" not in admin[0]  # never a literal in the manifest
    assert not any("--admin-token" in a for a in c.get("args", []) + c.get("command", []))
    assert env(docs).get("RAFTQ_AUTH", "on") != "off"  # access control stays on


def test_the_readme_says_how_to_write_secret_env() -> None:
    readme = (K8S.parents[1] / "README.md").read_text()
    assert "secret=" in readme and "admin-token=" in readme and "deploy/k8s/secret.env" in readme


def test_probes_hit_routes_the_node_serves(docs: dict[str, Any]) -> None:
    from raftq.node.app import all_routes, build_app
    from raftq.node.auth import PUBLIC

    app = build_app(LocalRaft())
    paths = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    public = {r.path for r in all_routes() if r.perm is not None and r.perm.action == PUBLIC}
    c = container(docs)
    # Kubelet probes send no token: they must hit routes that need none.
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] in public, probe
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" in paths
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" in paths
    assert c["readinessProbe"]["httpGet"]["port"] == "http"
    # liveness waits for startup: a large restart replays before the API answers
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    startup = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    assert startup >= 120
    assert docs["StatefulSet/raftq"]["spec"]["updateStrategy"]["type"] == "OnDelete"
    assert "preStop" in c["lifecycle"]
    grace = docs["StatefulSet/raftq"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= 20  # the node's graceful shutdown bound fits inside it
