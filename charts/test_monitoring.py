#!/usr/bin/env python3
"""Offline test of the chart's monitoring objects (values `monitoring.*`): the ServiceMonitor, the
PodMonitor, the PrometheusRule and the Grafana dashboard, as the real `helm template` renders them
(scripts/helm). The alerting rules are checked and unit-tested by Prometheus' own promtool
(scripts/promtool; the tests in charts/rules_test.yaml); every PromQL expression of the dashboard
is parsed by promtool too; every metric the rules and the dashboard name is one the operator or
the agent exports (the tables in operator/src/metrics.rs and agent/src/metrics.rs, whose own tests
read the names back from /metrics).

Needs: scripts/helm build; scripts/promtool build
Prints `N passed, 0 failed` at the end and exits 1 when anything failed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from checks import check, results  # charts/checks.py, beside this script

CHARTS = Path(__file__).resolve().parent
ROOT = CHARTS.parent
CHART = CHARTS / "toa-operator"
HELM = ROOT / "scripts" / "helm"
PROMTOOL = ROOT / "scripts" / "promtool"
ALL = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
       "rules": {"enabled": True}, "dashboard": {"enabled": True}}
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def helm_template(values):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(values, file)
        file.flush()
        run = subprocess.run([str(HELM), "template", "toa", str(CHART), "--namespace", "toa-system",
                              "-f", file.name], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    return [document for document in yaml.safe_load_all(run.stdout) if document]


def of_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def promtool(*args, cwd=None):
    run = subprocess.run([str(PROMTOOL), *args], capture_output=True, text=True, cwd=cwd, check=False)
    return run.returncode, run.stdout + run.stderr


def exported_metrics():
    """The metric names the module docs of both binaries' metrics list."""
    names = set()
    for source in ["operator/src/metrics.rs", "agent/src/metrics.rs"]:
        docs = "\n".join(line for line in (ROOT / source).read_text().splitlines() if line.startswith("//!"))
        names |= set(re.findall(r"`(toa_[a-z_]+)", docs))
    assert len(names) >= 10, names
    return names


def named_metrics(expression):
    """The toa_ metrics an expression reads, a histogram's series by the histogram's name."""
    return {re.sub(r"_(bucket|sum|count)$", "", name) for name in re.findall(r"\btoa_[a-z_]+", expression)}


DEFAULT = helm_template({})
MONITORED = helm_template({"monitoring": {**ALL, "labels": {"release": "prometheus"}}})


def rules_of(objects):
    return of_kind(objects, "PrometheusRule")[0]["spec"]


def dashboard_of(objects):
    config_map = [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert len(config_map) == 1, config_map
    return config_map[0], json.loads(config_map[0]["data"]["toa-compositions.json"])


@check("monitoring is off by default: no ServiceMonitor, PodMonitor, PrometheusRule or dashboard")
def _():
    kinds = {o["kind"] for o in DEFAULT}
    assert not kinds & MONITORING_KINDS, kinds
    assert not [o for o in of_kind(DEFAULT, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]


@check("each object renders when enabled, with monitoring.labels for the Prometheus' selectors")
def _():
    for kind in MONITORING_KINDS:
        found = of_kind(MONITORED, kind)
        assert len(found) == 1, (kind, found)
        assert found[0]["metadata"]["labels"]["release"] == "prometheus", found[0]["metadata"]
    config_map, _ = dashboard_of(MONITORED)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1", config_map["metadata"]


@check("the ServiceMonitor scrapes the operator's metrics Service port, keeping the Compositions' namespace")
def _():
    monitor = of_kind(MONITORED, "ServiceMonitor")[0]["spec"]
    service = [o for o in MONITORED if o["kind"] == "Service"][0]
    labels = service["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in monitor["selector"]["matchLabels"].items()), (monitor, labels)
    assert monitor["namespaceSelector"]["matchNames"] == ["toa-system"], monitor
    ports = [p["name"] for p in service["spec"]["ports"]]
    endpoint = monitor["endpoints"][0]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics", (endpoint, ports)
    assert endpoint["honorLabels"] is True, endpoint


@check("the PodMonitor scrapes the agents' probe port in the watched namespaces, naming each pod's Composition")
def _():
    monitor = of_kind(MONITORED, "PodMonitor")[0]["spec"]
    names = (ROOT / "operator/src/names.rs").read_text()
    desired = (ROOT / "operator/src/desired.rs").read_text()
    # The labels the operator puts on every pod it makes, and the agent's port name.
    assert '"app.kubernetes.io/managed-by".to_owned(),\n            MANAGER.to_owned()' in names, "names::labels"
    assert 'MANAGER: &str = "toa-operator"' in names and 'LABEL_COMPOSITION: &str = "toa.io/composition"' in names
    assert monitor["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "toa-operator"}, monitor
    assert monitor["selector"]["matchExpressions"] == [{"key": "toa.io/composition", "operator": "Exists"}]
    endpoint = monitor["podMetricsEndpoints"][0]
    assert endpoint["port"] == "probe" and '("probe", PROBE_PORT)' in desired, endpoint
    assert endpoint["relabelings"] == [{"sourceLabels": ["__meta_kubernetes_pod_label_toa_io_composition"],
                                        "targetLabel": "composition"}], endpoint
    assert monitor["namespaceSelector"] == {"any": True}, monitor
    scoped = of_kind(helm_template({"monitoring": ALL, "watchNamespaces": ["shop", "billing"]}), "PodMonitor")[0]
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["shop", "billing"]}, scoped["spec"]


@check("promtool: the rules are valid, and alert as charts/rules_test.yaml says (not Ready 10 min, halt called off, calls failing, no leader)")
def _():
    rules = rules_of(MONITORED)
    alerts = sorted(rule["alert"] for group in rules["groups"] for rule in group["rules"])
    assert alerts == ["ToaCallsFailing", "ToaCompositionNotReady", "ToaHaltCalledOff", "ToaOperatorNoLeader"], alerts
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "rules.yaml").write_text(yaml.safe_dump(rules))
        shutil.copy(CHARTS / "rules_test.yaml", directory)
        code, said = promtool("check", "rules", "rules.yaml", cwd=directory)
        assert code == 0 and "SUCCESS: 4 rules found" in said, said
        code, said = promtool("test", "rules", "rules_test.yaml", cwd=directory)
        assert code == 0 and "SUCCESS" in said, said


@check("ToaOperatorNoLeader only with the ServiceMonitor, which scrapes what it judges")
def _():
    rules = rules_of(helm_template({"monitoring": {"rules": {"enabled": True}}}))
    alerts = sorted(rule["alert"] for group in rules["groups"] for rule in group["rules"])
    assert alerts == ["ToaCallsFailing", "ToaCompositionNotReady", "ToaHaltCalledOff"], alerts


@check("the rules' thresholds come from values: notReadyFor, failingRatio, severity")
def _():
    rules = rules_of(helm_template({"monitoring": {"rules": {"enabled": True, "notReadyFor": "30m",
                                                             "failingRatio": 0.2, "severity": "critical"}}}))
    by_name = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}
    assert by_name["ToaCompositionNotReady"]["for"] == "30m", by_name["ToaCompositionNotReady"]
    assert "> 0.2" in by_name["ToaCallsFailing"]["expr"], by_name["ToaCallsFailing"]
    assert {rule["labels"]["severity"] for rule in by_name.values()} == {"critical"}


@check("the dashboard: valid JSON, every query parsed by promtool")
def _():
    _, dashboard = dashboard_of(MONITORED)
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(expressions) >= 10, expressions
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    # Grafana's variables as it substitutes them: $namespace by a regular expression.
    recording = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": expression.replace("$namespace", ".*")}
        for i, expression in enumerate(expressions)]}]}
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "dashboard.yaml").write_text(yaml.safe_dump(recording))
        code, said = promtool("check", "rules", "dashboard.yaml", cwd=directory)
        assert code == 0, said


@check("every metric the rules and the dashboard read is one the operator or the agent exports")
def _():
    exported = exported_metrics()
    _, dashboard = dashboard_of(MONITORED)
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    expressions += [rule["expr"] for group in rules_of(MONITORED)["groups"] for rule in group["rules"]]
    expressions += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    read = set().union(*(named_metrics(e) for e in expressions))
    assert read, expressions
    assert read <= exported, f"not exported: {sorted(read - exported)}"


if __name__ == "__main__":
    print(f"{results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)
