#!/usr/bin/env python3
"""Offline test of the toa-operator Helm chart.

Lints and renders charts/toa-operator with helm-python-sdk (Helm v4 as a library: no cluster, no
network), validates every rendered object with kubernetes-validate against the Kubernetes schemas
it ships for the floor and the newest supported release, and checks what the chart promises: the
Deployment runs `toa-operator run` with the agent image, two replicas, as non-root on a read-only
root; RBAC grants no wildcards; the Lease is granted by a namespaced Role only; Helm itself
(scripts/helm, the real command: the library does not check it) installs the chart on 1.33 and
later only, providers' suffixed versions included; the aggregated roles for people and the
admission policy render as configured, the policy only where the API server offers it.

helm-python-sdk's render cannot fake the server's API versions: its default capabilities list
groups and versions but no kinds, so `.Capabilities.APIVersions.Has
"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"` is false there and the policy is never
rendered (the library's C layer takes `api_versions`; Chart.render does not pass them on). What a
server offering it renders is taken from the real `helm template --api-versions` (scripts/helm), as
a user without a cluster runs it; charts/test_admission.py checks a real server's own answer.

Needs: python3 -m pip install helm-python-sdk kubernetes-validate; scripts/helm build
Prints `N passed, 0 failed` at the end and exits 1 when anything failed.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import yaml  # a dependency of kubernetes-validate
from checks import check, results  # charts/checks.py, beside this script

CHART = Path(__file__).resolve().parent / "toa-operator"
RELEASE = "toa"
NAMESPACE = "toa-system"
# The supported range's ends (docs/testing.md): the floor and the newest release tested.
KUBE_VERSIONS = ["1.33.0", "1.37.0"]
HELM = CHART.parent.parent / "scripts" / "helm"
CRD = yaml.safe_load((CHART.parent.parent / "crds" / "composition.yaml").read_text())
# What an API server offering the admission policy reports (discovery), as `--api-versions`.
POLICY_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"


def render(values=None):
    """The rendered objects, by kind and name; NOTES.txt is left out."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for document in yaml.safe_load_all(text):
            if document:
                objects.append(document)
    return objects


def helm_render(values=None, api_versions=(POLICY_API,)):
    """The objects the real `helm template` renders with `values`, the server offering
    `api_versions` (beside Helm's default ones); NOTES.txt is not rendered by it."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        json.dump(values or {}, file)
        file.flush()
        run = subprocess.run(
            [str(HELM), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", file.name]
            + [f"--api-versions={api}" for api in api_versions],
            capture_output=True, text=True, check=False,
        )
    if run.returncode != 0:
        raise helm.HelmError(run.stderr)
    return [document for document in yaml.safe_load_all(run.stdout) if document]


def one(objects, kind):
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def container(objects):
    deployment = one(objects, "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, containers
    return deployment, containers[0]


def lint(values=None):
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    assert report["total_charts_linted"] == 1, report
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report.get("errors", [])
    assert not problems, problems


def validate(objects):
    for version in KUBE_VERSIONS:
        for obj in objects:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                raise AssertionError(
                    f"{obj['kind']}/{obj['metadata']['name']} is invalid for {version}: "
                    f"{error.message} at {'.'.join(map(str, error.path))}"
                ) from None


DEFAULT = render()
SINGLE = render({"leaderElection": False, "replicas": 1})
WATCHED = ["shop", "billing"]
NAMESPACED = render({"watchNamespaces": WATCHED})
# Where the API server offers ValidatingAdmissionPolicy (every supported release does).
POLICY = helm_render()


def operator_role(objects):
    """The operator's own ClusterRole (the release's full name), not the aggregated ones."""
    found = [o for o in objects
             if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "toa-toa-operator"]
    assert len(found) == 1, f"expected the ClusterRole toa-toa-operator, got {len(found)}"
    return found[0]


def named(objects, kind, suffix):
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"expected one {kind} named *{suffix}, got {len(found)}"
    return found[0]


def grants(role):
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@check("the chart lints cleanly (strict) with default values")
def _():
    lint()


@check("the chart lints cleanly (strict) with leaderElection=false")
def _():
    lint({"leaderElection": False, "replicas": 1})


@check("values.schema.json: a misspelt or mistyped value fails helm template and lint, naming it; every default passes")
def _():
    refused = {
        "replica": {"replica": 2},  # a misspelt key, which Helm would otherwise ignore
        "replicas": {"replicas": "two"},
        "pullPolicy": {"image": {"pullPolicy": "Sometimes"}},
        "watchNamespaces": {"watchNamespaces": ["Shop"]},
        "port": {"metrics": {"port": 70000}},
        "format": {"logs": {"format": "xml"}},
        "extraEnv": {"extraEnv": [{"name": "POD_NAME", "value": "x"}]},
        "maxUnavailable": {"podDisruptionBudget": {"maxUnavailable": 0}},
        # A flag the chart passes itself: clap refuses it twice, and the operator would not start.
        "extraArgs": {"extraArgs": ["--lease-name=other"]},
    }
    for name, values in refused.items():
        try:
            helm_render(values)
        except helm.HelmError as error:
            assert "values don't meet the specifications of the schema" in str(error), error
            assert name in str(error), f"{name}: {error}"
        else:
            raise AssertionError(f"{values} rendered")
        try:
            lint(values)
        except (AssertionError, helm.HelmError) as error:
            assert name in str(error), f"{name}: {error}"
        else:
            raise AssertionError(f"{values} linted")
    # values.yaml itself, and every value it documents at a value of its own kind.
    helm_render({"imagePullSecrets": [{"name": "registry"}], "nodeNetworks": ["100.64.0.0/16"],
                 "podAnnotations": {"a": "b"}, "tolerations": [{"operator": "Exists"}],
                 "podDisruptionBudget": {"maxUnavailable": "50%"}, "extraArgs": ["--lease-identity=me"]})


@check("the operator's log level and format come from logs: plain at info by default, json when asked")
def _():
    def env(objects):
        _, c = container(objects)
        return {e["name"]: e.get("value") for e in c["env"]}
    assert env(DEFAULT)["TOA_LOG_LEVEL"] == "info", env(DEFAULT)
    assert env(DEFAULT)["TOA_LOG_FORMAT"] == "plain", env(DEFAULT)
    asked = env(render({"logs": {"level": "debug", "format": "json"}}))
    assert (asked["TOA_LOG_LEVEL"], asked["TOA_LOG_FORMAT"]) == ("debug", "json"), asked


@check("Chart.yaml: apiVersion v2, toa-operator 0.1.0, appVersion 0.1.0")
def _():
    with helm.Chart.load(CHART) as chart:
        meta = chart.metadata
    assert meta["apiVersion"] == "v2", meta
    assert meta["name"] == "toa-operator", meta
    assert meta["version"] == "0.1.0", meta
    assert meta["appVersion"] == "0.1.0", meta


@check("the chart renders the Composition CRD (so helm upgrade updates it): crds/composition.yaml, labelled, kept on uninstall")
def _():
    with helm.Chart.load(CHART) as chart:
        assert chart.crds == [], "a CRD in crds/ is installed once and never upgraded by Helm"
    shipped = (CHART / "files" / "composition.yaml").read_text()
    committed = (CHART.parent.parent / "crds" / "composition.yaml").read_text()
    assert shipped == committed, "charts/toa-operator/files/composition.yaml differs from crds/"
    crd = copy.deepcopy(one(DEFAULT, "CustomResourceDefinition"))
    metadata = crd.pop("metadata")
    assert metadata["annotations"] == {"helm.sh/resource-policy": "keep"}, metadata
    assert metadata["labels"]["app.kubernetes.io/managed-by"] == "Helm", metadata
    committed = yaml.safe_load(committed)
    assert metadata["name"] == committed.pop("metadata")["name"] == "compositions.toa.io"
    crd.pop("apiVersion"), crd.pop("kind")
    assert crd == {k: v for k, v in committed.items() if k not in ("apiVersion", "kind")}, \
        "the rendered CRD's schema differs from crds/composition.yaml"
    unkept = one(render({"crd": {"keep": False}}), "CustomResourceDefinition")
    assert "annotations" not in unkept["metadata"], unkept["metadata"]
    assert not [o for o in render({"crd": {"install": False}}) if o["kind"] == "CustomResourceDefinition"]


@check("default values render the expected objects")
def _():
    kinds = sorted(o["kind"] for o in DEFAULT)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "Pod",  # helm test's
            "PodDisruptionBudget",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    ), kinds


@check("every object rendered with default values is valid Kubernetes")
def _():
    validate(DEFAULT)


@check("every object rendered with leaderElection=false is valid Kubernetes")
def _():
    validate(SINGLE)


@check("the Deployment runs `run` with the agent image, 2 replicas, leader election on")
def _():
    deployment, c = container(DEFAULT)
    assert deployment["spec"]["replicas"] == 2, deployment["spec"]["replicas"]
    assert c["image"] == "registry.example.com/toa-operator:0.1.0", c["image"]
    args = c["args"]
    assert args[0] == "run", args
    assert "--agent-image=registry.example.com/toa-agent:0.1.0" in args, args
    resources = [a for a in args if a.startswith("--agent-resources=")]
    assert len(resources) == 1, args
    assert json.loads(resources[0].split("=", 1)[1]) == {
        "requests": {"cpu": "50m", "memory": "32Mi"},
        "limits": {"memory": "128Mi"},
    }, resources
    assert "--metrics-listen=0.0.0.0:8080" in args, args
    assert "--leader-election=on" in args, args
    assert "--lease-name=toa-operator" in args, args
    assert f"--lease-namespace={NAMESPACE}" in args, args
    env = {e["name"]: e for e in c.get("env", [])}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", env


@check("networkPolicy: on by default, naming the operator's namespace and pod labels; off on request")
def _():
    deployment, c = container(DEFAULT)
    given = [a for a in c["args"] if a.startswith("--control-from=")]
    assert len(given) == 1, c["args"]
    namespace, labels = given[0].split("=", 1)[1].split("/", 1)
    assert namespace == NAMESPACE, given
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for pair in labels.split(","):
        key, value = pair.split("=", 1)
        assert pod_labels.get(key) == value, (pair, pod_labels)
    _, c = container(render({"networkPolicy": {"enabled": False}}))
    assert not any(a.startswith("--control-from") for a in c["args"]), c["args"]


@check("networkPolicy.egress: none by default; given, passed as one JSON list of rules")
def _():
    _, c = container(DEFAULT)
    assert not any(a.startswith("--egress-rules") for a in c["args"]), c["args"]
    rules = [{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "db"}}}],
              "ports": [{"port": 6379}, {"port": 5672}]}]
    _, c = container(render({"networkPolicy": {"egress": rules}}))
    given = [a for a in c["args"] if a.startswith("--egress-rules=")]
    assert len(given) == 1, c["args"]
    assert json.loads(given[0].split("=", 1)[1]) == rules, given
    _, c = container(render({"networkPolicy": {"enabled": False, "egress": rules}}))
    assert not any(a.startswith("--egress-rules") for a in c["args"]), "no policy, no rules"


@check("nodeNetworks: none by default; given, one comma-separated --node-networks")
def _():
    _, c = container(DEFAULT)
    assert not any(a.startswith("--node-networks") for a in c["args"]), c["args"]
    _, c = container(render({"nodeNetworks": ["100.64.0.0/16", "fd98::/64"]}))
    assert "--node-networks=100.64.0.0/16,fd98::/64" in c["args"], c["args"]


@check("the Deployment passes only flags that `toa-operator run` takes")
def _():
    known = {
        "--agent-image",
        "--agent-resources",
        "--metrics-listen",
        "--leader-election",
        "--lease-name",
        "--lease-namespace",
        "--lease-identity",
        "--control-from",
        "--key-secret",
        "--key-namespace",
        "--watch-namespaces",
    }
    source = (CHART.parent.parent / "operator" / "src" / "args.rs").read_text()
    for objects in (DEFAULT, SINGLE, NAMESPACED):
        _, c = container(objects)
        for arg in c["args"][1:]:
            flag = arg.split("=", 1)[0]
            assert flag in known, arg
            field = flag[2:].replace("-", "_")
            assert f"pub {field}:" in source, f"{flag} is not a field of RunArgs"


@check("podDisruptionBudget: one at a time of two replicas or more, unready pods always evictable; none for one replica")
def _():
    budget = one(DEFAULT, "PodDisruptionBudget")["spec"]
    deployment, _ = container(DEFAULT)
    assert budget["selector"] == deployment["spec"]["selector"], (budget, deployment["spec"]["selector"])
    assert budget["maxUnavailable"] == 1 and budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow", budget
    assert one(render({"podDisruptionBudget": {"maxUnavailable": 2}, "replicas": 3}),
               "PodDisruptionBudget")["spec"]["maxUnavailable"] == 2
    for values in [{"leaderElection": False, "replicas": 1}, {"podDisruptionBudget": {"enabled": False}}]:
        assert not [o for o in render(values) if o["kind"] == "PodDisruptionBudget"], values


@check("topologySpreadConstraints: soft spread over nodes by default, counting the operator's pods; given ones kept")
def _():
    deployment, _ = container(DEFAULT)
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread == [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                       "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}}], spread
    own = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"team": "platform"}}}
    deployment, _ = container(render({"topologySpreadConstraints": [own]}))
    assert deployment["spec"]["template"]["spec"]["topologySpreadConstraints"] == [own]
    deployment, _ = container(render({"topologySpreadConstraints": []}))
    assert "topologySpreadConstraints" not in deployment["spec"]["template"]["spec"]


@check("priorityClassName, extraArgs and extraEnv reach the operator's pod after the chart's own")
def _():
    objects = render({"priorityClassName": "system-cluster-critical", "extraArgs": ["--lease-identity=me"],
                      "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]})
    deployment, c = container(objects)
    assert deployment["spec"]["template"]["spec"]["priorityClassName"] == "system-cluster-critical"
    assert c["args"][-1] == "--lease-identity=me", c["args"]
    assert c["env"][-1] == {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}, c["env"]
    assert [e["name"] for e in c["env"]][:3] == ["TOA_LOG_LEVEL", "TOA_LOG_FORMAT", "POD_NAME"], c["env"]
    validate(objects)
    deployment, _ = container(DEFAULT)
    assert "priorityClassName" not in deployment["spec"]["template"]["spec"]


@check("helm test: a restricted pod of the operator's image asks /ready through the metrics Service")
def _():
    pod = one(DEFAULT, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test", pod["metadata"]
    # Never one of the operator's pods: its ReplicaSet would adopt it.
    deployment, _ = container(DEFAULT)
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert not all(pod["metadata"]["labels"].get(k) == v for k, v in selector.items()), pod["metadata"]
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False, spec
    _, operator = container(DEFAULT)
    probe = spec["containers"][0]
    assert probe["image"] == operator["image"], probe
    service = one(DEFAULT, "Service")
    port = service["spec"]["ports"][0]["port"]
    address = f"{service['metadata']['name']}.{NAMESPACE}.svc:{port}"
    assert probe["args"] == ["probe", f"http://{address}/ready", "--timeout=60"], probe["args"]
    assert probe["securityContext"] == operator["securityContext"], probe
    elsewhere = one(render({"tests": {"address": "10.88.0.1:18080", "timeoutSeconds": 5}}), "Pod")
    assert elsewhere["spec"]["containers"][0]["args"][1:] == ["http://10.88.0.1:18080/ready", "--timeout=5"]
    assert not [o for o in render({"tests": {"enabled": False}}) if o["kind"] == "Pod"]


@check("the Deployment runs as non-root on a read-only root filesystem")
def _():
    deployment, c = container(DEFAULT)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True, pod["securityContext"]
    assert pod["securityContext"]["runAsUser"] != 0, pod["securityContext"]
    security = c["securityContext"]
    assert security["readOnlyRootFilesystem"] is True, security
    assert security["allowPrivilegeEscalation"] is False, security
    assert security["capabilities"]["drop"] == ["ALL"], security
    assert pod["serviceAccountName"] == one(DEFAULT, "ServiceAccount")["metadata"]["name"]


@check("the metrics port is served and exposed by the Service")
def _():
    _, c = container(DEFAULT)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080}, ports
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    service = one(DEFAULT, "Service")
    assert service["spec"]["ports"][0]["port"] == 8080, service["spec"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics", service["spec"]
    selector = service["spec"]["selector"]
    labels = one(DEFAULT, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in selector.items()), (selector, labels)


@check("RBAC grants no wildcard verbs, resources or groups")
def _():
    for objects in (DEFAULT, SINGLE, NAMESPACED, POLICY):
        for role in (o for o in objects if o["kind"] in ("ClusterRole", "Role")):
            for rule in role["rules"]:
                for key in ("verbs", "resources", "apiGroups"):
                    assert "*" not in rule.get(key, []), (role["metadata"]["name"], rule)
                assert "nonResourceURLs" not in rule, rule


@check("the ClusterRole grants what the controller uses and never delete")
def _():
    granted = grants(operator_role(DEFAULT))
    needed = {
        ("toa.io", "compositions", "list"),
        ("toa.io", "compositions", "watch"),
        ("toa.io", "compositions", "patch"),
        ("toa.io", "compositions/status", "patch"),
        ("apps", "deployments", "list"),
        ("apps", "deployments", "watch"),
        ("apps", "deployments", "patch"),
        ("", "configmaps", "watch"),
        ("", "configmaps", "patch"),
        ("", "secrets", "create"),
        ("", "secrets", "patch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("events.k8s.io", "events", "create"),
        ("networking.k8s.io", "networkpolicies", "create"),
        ("networking.k8s.io", "networkpolicies", "patch"),
        ("policy", "poddisruptionbudgets", "create"),
        ("policy", "poddisruptionbudgets", "patch"),
    }
    # Exactly what the code asks for (the e2e suite fails on any `forbidden`), and no more.
    needed |= {
        ("toa.io", "compositions/finalizers", "update"),
        ("apps", "deployments", "get"),
        ("apps", "deployments", "create"),
        ("", "configmaps", "get"),
        ("", "configmaps", "list"),
        ("", "configmaps", "create"),
        ("events.k8s.io", "events", "patch"),
        # Read before written: one that is not the Composition's is never changed.
        ("networking.k8s.io", "networkpolicies", "get"),
        ("policy", "poddisruptionbudgets", "get"),
    }
    assert needed == granted, (needed - granted, granted - needed)
    assert not any(verb in ("delete", "deletecollection", "escalate", "bind", "impersonate")
                   for _, _, verb in granted), granted
    assert not any(resource == "leases" for _, resource, _ in granted), granted
    # The control Secrets' tokens are derived from the operator's key: written, never read.
    secrets = {verb for _, resource, verb in granted if resource == "secrets"}
    assert secrets == {"create", "patch"}, secrets


@check("the operator's key: `get` on that one Secret by name, in the release namespace only")
def _():
    role = named(DEFAULT, "Role", "-key")
    assert role["metadata"]["namespace"] == NAMESPACE, role["metadata"]
    for rule in role["rules"]:
        assert rule["resources"] == ["secrets"], rule
        if "get" in rule["verbs"]:
            assert rule["verbs"] == ["get"], rule
            assert rule["resourceNames"] == ["toa-toa-operator-key"], rule
        else:
            assert rule["verbs"] == ["create"], rule
    _, c = container(DEFAULT)
    assert "--key-secret=toa-toa-operator-key" in c["args"], c["args"]
    assert f"--key-namespace={NAMESPACE}" in c["args"], c["args"]
    binding = named(DEFAULT, "RoleBinding", "-key")
    assert binding["roleRef"]["name"] == role["metadata"]["name"], binding
    custom = named(render({"keySecret": "op-key"}), "Role", "-key")
    assert custom["rules"][0]["resourceNames"] == ["op-key"], custom


@check("watchNamespaces: a Role and RoleBinding per namespace, no cluster-wide grant")
def _():
    kinds = [o["kind"] for o in NAMESPACED]
    assert "ClusterRoleBinding" not in kinds, kinds
    # The only ClusterRoles are the aggregated ones for people, which nothing here binds.
    cluster_roles = [o["metadata"]["name"] for o in NAMESPACED if o["kind"] == "ClusterRole"]
    assert sorted(cluster_roles) == [
        "toa-toa-operator-composition-edit", "toa-toa-operator-composition-view"
    ], cluster_roles
    cluster = grants(operator_role(DEFAULT))
    roles = [o for o in NAMESPACED
             if o["kind"] == "Role" and o["metadata"]["namespace"] in WATCHED]
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(WATCHED), roles
    for role in roles:
        assert grants(role) == cluster, role
    bindings = [o for o in NAMESPACED
                if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] in WATCHED]
    assert len(bindings) == len(WATCHED), bindings
    account = one(NAMESPACED, "ServiceAccount")["metadata"]
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
        ], binding
    _, c = container(NAMESPACED)
    assert "--watch-namespaces=shop,billing" in c["args"], c["args"]
    _, c = container(DEFAULT)
    assert not any(a.startswith("--watch-namespaces") for a in c["args"]), c["args"]
    lint({"watchNamespaces": WATCHED})
    validate(NAMESPACED)


@check("the Lease is granted by a Role in the release namespace only")
def _():
    role = named(DEFAULT, "Role", "-lease")
    assert role["metadata"]["namespace"] == NAMESPACE, role["metadata"]
    for rule in role["rules"]:
        assert rule["apiGroups"] == ["coordination.k8s.io"], rule
        assert rule["resources"] == ["leases"], rule
    verbs = {verb for rule in role["rules"] for verb in rule["verbs"]}
    assert verbs == {"get", "create", "update"}, verbs
    binding = named(DEFAULT, "RoleBinding", "-lease")
    assert binding["metadata"]["namespace"] == NAMESPACE, binding["metadata"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }, binding["roleRef"]
    account = one(DEFAULT, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
    ], binding["subjects"]


@check("the ClusterRoleBinding binds the ClusterRole to the operator's ServiceAccount")
def _():
    binding = one(DEFAULT, "ClusterRoleBinding")
    assert binding["roleRef"]["kind"] == "ClusterRole", binding["roleRef"]
    assert binding["roleRef"]["name"] == operator_role(DEFAULT)["metadata"]["name"]
    account = one(DEFAULT, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
    ], binding["subjects"]


@check("leaderElection=false: no Lease RBAC, `--leader-election=off`, no lease flags")
def _():
    names = {o["metadata"]["name"] for o in SINGLE if o["kind"] in ("Role", "RoleBinding")}
    assert not any(name.endswith("-lease") for name in names), names
    deployment, c = container(SINGLE)
    assert deployment["spec"]["replicas"] == 1
    assert "--leader-election=off" in c["args"], c["args"]
    assert not any(a.startswith("--lease-") for a in c["args"]), c["args"]


@check("leaderElection=false with more than one replica is refused")
def _():
    try:
        render({"leaderElection": False})
    except helm.HelmError as error:
        assert "one replica" in str(error), error
    else:
        raise AssertionError("rendered two replicas without leader election")


@check("image tags and names can be overridden")
def _():
    objects = render(
        {
            "image": {"repository": "r.example/op", "tag": "2.0"},
            "agentImage": {"repository": "r.example/agent", "tag": "2.1"},
            "serviceAccount": {"name": "custom"},
        }
    )
    deployment, c = container(objects)
    assert c["image"] == "r.example/op:2.0", c["image"]
    assert "--agent-image=r.example/agent:2.1" in c["args"], c["args"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "custom"
    assert one(objects, "ServiceAccount")["metadata"]["name"] == "custom"
    validate(objects)


AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


@check("aggregated roles: edit (into edit and admin) writes and scales Compositions, view reads them")
def _():
    edit = named(DEFAULT, "ClusterRole", "-composition-edit")
    view = named(DEFAULT, "ClusterRole", "-composition-view")
    assert edit["metadata"]["name"] == "toa-toa-operator-composition-edit", edit["metadata"]
    assert view["metadata"]["name"] == "toa-toa-operator-composition-view", view["metadata"]

    def aggregates(role):
        return sorted(k[len(AGGREGATE):] for k, v in role["metadata"]["labels"].items()
                      if k.startswith(AGGREGATE) and v == "true")

    assert aggregates(edit) == ["admin", "edit"], edit["metadata"]["labels"]
    assert aggregates(view) == ["view"], view["metadata"]["labels"]
    group = CRD["spec"]["group"]
    plural = CRD["spec"]["names"]["plural"]
    assert grants(edit) == {
        (group, plural, verb)
        for verb in ("get", "list", "watch", "create", "update", "patch", "delete")
    } | {(group, f"{plural}/scale", verb) for verb in ("get", "update", "patch")}, grants(edit)
    assert grants(view) == {
        (group, resource, verb)
        for resource in (plural, f"{plural}/status", f"{plural}/scale")
        for verb in ("get", "list", "watch")
    }, grants(view)
    # People never write the status (the operator's) and get no Secret through these.
    for role in (edit, view):
        for _, resource, verb in grants(role):
            assert resource != "secrets", role
            assert resource != f"{plural}/status" or verb in ("get", "list", "watch"), role
    # Nothing binds them but the built-in roles' aggregation.
    for objects in (DEFAULT, NAMESPACED):
        bound = {o["roleRef"]["name"] for o in objects if o["kind"].endswith("Binding")}
        assert not bound & {edit["metadata"]["name"], view["metadata"]["name"]}, bound


@check("aggregatedRoles.enabled=false: no role for people")
def _():
    objects = render({"aggregatedRoles": {"enabled": False}})
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRole"]
    assert names == ["toa-toa-operator"], names


@check("the admission policy: rendered where the server offers it and admissionPolicy.enabled")
def _():
    policy_kinds = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    # helm-python-sdk: no kinds among its capabilities, so never (see the docstring).
    assert not policy_kinds & {o["kind"] for o in DEFAULT}, "rendered without the capability"
    # The real `helm template`, offline: only when told the server offers it.
    assert not policy_kinds & {o["kind"] for o in helm_render(api_versions=())}
    assert sorted(o["kind"] for o in POLICY if o["kind"] in policy_kinds) == sorted(policy_kinds)
    off = helm_render({"admissionPolicy": {"enabled": False}})
    assert not policy_kinds & {o["kind"] for o in off}, "rendered with enabled=false"
    # Everything else renders the same either way.
    offline = helm_render(api_versions=())
    assert [o for o in POLICY if o["kind"] not in policy_kinds] == offline == off


@check("NOTES.txt warns when the admission policy was not installed")
def _():
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render({}, name=RELEASE, namespace=NAMESPACE, is_install=True)
        quiet = chart.render({"admissionPolicy": {"enabled": False}}, name=RELEASE,
                             namespace=NAMESPACE, is_install=True)
    notes = next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))
    assert "WARNING: the admission policy was NOT installed" in notes, notes
    assert "--api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" in notes
    notes = next(text for path, text in quiet.items() if path.endswith("NOTES.txt"))
    assert "admission policy" not in notes.lower(), notes
    # With the policy installed, the notes name the hosts: `helm template` renders no notes and
    # `helm install --dry-run=client` takes no --api-versions; charts/test_admission.py reads them
    # from `helm install --dry-run=server` against a real API server.


@check("the admission policy: Fail, Deny, CREATE and UPDATE of the CRD's compositions, no params")
def _():
    policy = one(POLICY, "ValidatingAdmissionPolicy")
    binding = one(POLICY, "ValidatingAdmissionPolicyBinding")
    assert policy["metadata"]["name"] == "toa-toa-operator-compositions", policy["metadata"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail", spec
    assert "paramKind" not in spec, spec
    assert spec["matchConstraints"]["matchPolicy"] == "Equivalent", spec["matchConstraints"]
    assert spec["matchConstraints"]["resourceRules"] == [{
        "apiGroups": [CRD["spec"]["group"]],
        "apiVersions": [v["name"] for v in CRD["spec"]["versions"]],
        "operations": ["CREATE", "UPDATE"],
        "resources": [CRD["spec"]["names"]["plural"]],
    }], spec["matchConstraints"]
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }, binding["spec"]
    expressions = [v["expression"] for v in spec["validations"]]
    secret = [e for e in expressions if "resource('secrets')" in e]
    # The credentials Secret, a CloudNativePG cluster's two, the registry Secrets, the variables'.
    assert len(secret) == 4, expressions
    for expression in secret:
        assert " ".join(expression.split()).replace(") .", ").").count(
            "authorizer.group('').resource('secrets').namespace(request.namespace).name(") == 1, \
            expression
    assert ".name(variables.secretName).check('get').allowed()" in secret[0], secret
    assert ".name(variables.cluster + suffix).check('get').allowed()" in secret[1], secret
    assert ".name(n).check('get').allowed()" in secret[2], secret
    assert "variables.envSecrets.all(names, names.all(n," in secret[3], secret
    config_maps = [e for e in expressions if "resource('configmaps')" in e]
    assert len(config_maps) == 1 and "variables.envConfigMaps.all(names, names.all(n," in config_maps[0]
    # The pods' ServiceAccount: `use` of it.
    account = [e for e in expressions if "resource('serviceaccounts')" in e]
    assert len(account) == 1 and ".check('use').allowed()" in account[0], expressions
    # A message for every refusal, and one to fall back on should the expression fail.
    for validation in spec["validations"]:
        assert validation["message"] and validation["messageExpression"], validation
        assert validation["reason"] == "Forbidden", validation
    # The spec fields left out of the update's comparison exist, and are the operating ones.
    condition = spec["matchConditions"]
    assert [c["name"] for c in condition] == ["reconfigures"], condition
    properties = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for field in ("replicas", "halted", "halt"):
        assert field in properties["properties"], field
        assert f"'{field}'" in condition[0]["expression"], condition
    # A CEL string literal never spans two lines (a newline in one does not compile).
    for text in [v["expression"] for v in spec["variables"]] + expressions + [
        v["messageExpression"] for v in spec["validations"]
    ]:
        for line in text.splitlines():
            assert line.count("'") % 2 == 0, line


def hosts(objects):
    """The policy's allowedHosts variables: (any host, suffixes, exact hosts)."""
    variables = {v["name"]: v["expression"]
                 for v in one(objects, "ValidatingAdmissionPolicy")["spec"]["variables"]}
    return (json.loads(variables["anyHost"]), json.loads(variables["hostSuffixes"]),
            json.loads(variables["exactHosts"]))


@check("admissionPolicy.allowedHosts: in-cluster Services by default; suffixes, exact hosts, *")
def _():
    assert hosts(POLICY) == (False, [".svc", ".svc.cluster.local"], []), hosts(POLICY)
    message = next(v["messageExpression"]
                   for v in one(POLICY, "ValidatingAdmissionPolicy")["spec"]["validations"]
                   if "variables.refused" in v["messageExpression"])
    assert "'*.svc, *.svc.cluster.local'" in message, message
    assert "admissionPolicy.allowedHosts" in message, message
    custom = helm_render({"admissionPolicy": {"allowedHosts": [
        "*.svc", "redis.example.com", "10.0.0.7", "*.corp.example"]}})
    assert hosts(custom) == (False, [".svc", ".corp.example"], ["redis.example.com", "10.0.0.7"])
    assert hosts(helm_render({"admissionPolicy": {"allowedHosts": ["*"]}})) == (True, [], [])
    assert hosts(helm_render({"admissionPolicy": {"allowedHosts": []}})) == (False, [], [])
    validate(custom)


@check("admissionPolicy.allowedHosts: an entry that is no host nor suffix is refused by name")
def _():
    for entry in ["*evil.com", "Redis.svc", "redis://redis.svc", "a b", "", "*.", "host:6379",
                  "x'.svc", "*.*.svc", "[::1]"]:
        try:
            helm_render({"admissionPolicy": {"allowedHosts": [entry]}})
        except helm.HelmError as error:
            assert "admissionPolicy.allowedHosts" in str(error), error
            assert json.dumps(entry) in str(error), (entry, str(error))
        else:
            raise AssertionError(f"rendered with allowedHosts [{entry!r}]")
    try:
        helm_render({"admissionPolicy": {"allowedHosts": [5]}})
    except helm.HelmError as error:
        # values.schema.json refuses it before the template's own check ("is not a string").
        assert "/admissionPolicy/allowedHosts/0': got number, want string" in str(error), error
    else:
        raise AssertionError("rendered with allowedHosts [5]")
    # Checked where the policy is not installed too (the library: no capability).
    try:
        render({"admissionPolicy": {"allowedHosts": ["Redis.svc"]}})
    except helm.HelmError as error:
        assert '"Redis.svc"' in str(error), error
    else:
        raise AssertionError("rendered allowedHosts [Redis.svc] without the capability")


@check("the admission policy's binding: scoped to watchNamespaces when they are listed")
def _():
    binding = one(helm_render({"watchNamespaces": WATCHED}), "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"] == {"namespaceSelector": {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In", "values": WATCHED,
    }]}}, binding["spec"]
    assert "matchResources" not in one(POLICY, "ValidatingAdmissionPolicyBinding")["spec"]


@check("every object rendered with the admission policy is valid Kubernetes, and lints")
def _():
    validate(POLICY)
    validate(helm_render({"watchNamespaces": WATCHED}))
    lint({"admissionPolicy": {"allowedHosts": ["*", "redis.example.com"]}})


def helm_template(kube_version):
    """`helm template` as a user runs it against a server of `kube_version`."""
    return subprocess.run(
        [str(HELM), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
         "--kube-version", kube_version],
        capture_output=True, text=True, check=False,
    )


@check("kubeVersion: Helm installs on 1.33 and later, suffixed versions too, and refuses 1.32")
def _():
    with helm.Chart.load(CHART) as chart:
        assert chart.metadata["kubeVersion"] == ">=1.33.0-0", chart.metadata
    for version in ["1.33.0", "v1.33.0-gke.1200", "v1.34.3-eks-4d6e9a0", "1.37.2"]:
        run = helm_template(version)
        assert run.returncode == 0, (version, run.stderr)
        assert "kind: Deployment" in run.stdout, version
    run = helm_template("1.32.9")
    assert run.returncode != 0, "rendered for 1.32.9"
    assert "incompatible with Kubernetes v1.32.9" in run.stderr, run.stderr


@check("NOTES.txt renders")
def _():
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render({}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    notes = [text for path, text in manifests.items() if path.endswith("NOTES.txt")]
    assert len(notes) == 1 and "toa-system" in notes[0], manifests.keys()


@check("the Dockerfiles build the binaries the chart and the operator run, as the chart's user")
def _():
    objects = render()
    deployment, c = container(objects)
    uid = deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    root = CHART.parent.parent
    for dockerfile, binary in [("operator/Dockerfile", "toa-operator"), ("agent/Dockerfile", "toa-agent")]:
        text = (root / dockerfile).read_text()
        lines = [line.strip() for line in text.splitlines()]
        assert f"cargo build --release --locked -p {binary} \\" in lines, (dockerfile, lines)
        assert f'ENTRYPOINT ["/usr/local/bin/{binary}"]' in lines, dockerfile
        assert f"USER {uid}:{uid}" in lines, (dockerfile, uid)
        # Multi-stage: the final image is not the build image.
        froms = [line for line in lines if line.startswith("FROM ")]
        assert len(froms) == 2 and "distroless" in froms[-1], froms
    # The operator's image runs `toa-operator run`, which the chart's args start with.
    assert c["args"][0] == "run", c["args"]


print(f"{results['passed']} passed, {results['failed']} failed")
sys.exit(1 if results["failed"] else 0)
