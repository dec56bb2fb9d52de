#!/usr/bin/env python3
"""Lints and renders a Helm chart with Helm v4's library (PyPI helm-python-sdk).

    helm-chart.py lint   CHART [--values JSON] [--namespace NS]
    helm-chart.py render CHART [--values JSON] [--namespace NS] [--name RELEASE]
    helm-chart.py install|upgrade CHART --kubeconfig FILE [--values JSON] [--namespace NS]
                  [--name RELEASE]

`lint` prints the report as JSON and exits 1 when it has errors. `render` prints the
templates as one YAML stream (sorted by path, each introduced by a `# Source:` comment),
the chart's CRDs excluded (they live in CHART/crds). `install` and `upgrade` run Helm's own
actions against the cluster of the kubeconfig (no wait) and print the release's name,
namespace, revision and status as JSON.
"""

import argparse
import json
import sys

import helm_python as helm


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["lint", "render", "install", "upgrade"])
    p.add_argument("chart")
    p.add_argument("--values", default="{}", help="values as a JSON object")
    p.add_argument("--namespace", default="autonodes-system")
    p.add_argument("--name", default="autonodes")
    p.add_argument("--kubeconfig")
    a = p.parse_args()
    values = json.loads(a.values)
    if a.command in ("install", "upgrade"):
        with helm.Config(kubeconfig_path=a.kubeconfig, namespace=a.namespace) as config:
            act = config.install if a.command == "install" else config.upgrade
            release = act(a.chart, a.name, values, namespace=a.namespace, timeout=120)
        release = release if isinstance(release, dict) else {}
        summary = {k: release.get(k) for k in ("name", "namespace", "revision", "status")}
        print(json.dumps(summary, default=str))
        return 0
    if a.command == "lint":
        report = helm.lint(a.chart, values, strict=True, namespace=a.namespace)
        print(json.dumps(report, indent=2))
        bad = report.get("errors") or [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
        return 1 if bad else 0
    with helm.Chart.load(a.chart) as chart:
        manifests = chart.render(values, name=a.name, namespace=a.namespace, is_install=True)
    for path in sorted(manifests):
        body = manifests[path].strip()
        if not body or path.endswith("NOTES.txt"):
            continue
        print(f"---\n# Source: {path}\n{body}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
