#!/usr/bin/env python3
"""Prints what `helm install` would install from charts/toa-operator, as one YAML stream.

    python3 charts/render.py [--release NAME] [--namespace NAMESPACE] [--set KEY=JSON]...

The chart's CRDs (crds/) come first, then every rendered template but NOTES.txt, each object once,
in the order Helm would install them by kind. Rendered offline with helm-python-sdk (Helm v4 as a
library: no helm binary, no cluster). `--set leaderElection=false --set replicas=1` sets values;
a value is read as JSON when it parses (numbers, booleans), else taken as a string. The end-to-end
suite (operator/tests/e2e.rs) applies this output to its control plane.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import helm_python as helm
import yaml  # a dependency of kubernetes-validate, installed beside helm-python-sdk

CHART = Path(__file__).resolve().parent / "toa-operator"

# Helm's install order for the kinds the chart renders (pkg/release/util/kind_sorter.go).
ORDER = [
    "Namespace",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "Deployment",
]


def values_from(settings):
    values = {}
    for setting in settings:
        key, _, text = setting.partition("=")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        target = values
        *parents, last = key.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[last] = value
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", default="toa")
    parser.add_argument("--namespace", default="toa-system")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    with helm.Chart.load(CHART) as chart:
        crds = [yaml.safe_load(crd["data"]) for crd in chart.crds]
        manifests = chart.render(
            values_from(args.set), name=args.release, namespace=args.namespace, is_install=True
        )
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(document for document in yaml.safe_load_all(text) if document)
    rank = {kind: index for index, kind in enumerate(ORDER)}
    objects.sort(key=lambda obj: rank.get(obj["kind"], len(ORDER)))
    yaml.safe_dump_all(crds + objects, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
