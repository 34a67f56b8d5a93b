"""Drives the Helm engine embedded in helm-sdkpy (Helm 4) for the chart tests.

    helm.py lint CHART                      -> prints lint messages, exit 1 on errors
    helm.py install CHART KUBECONFIG NAME VALUES_JSON [NAMESPACE [UPGRADE_VALUES_JSON]]
                                            -> installs into the cluster (release storage in
                                               memory, no waiting; NAMESPACE default
                                               kube-system), then upgrades the release with
                                               UPGRADE_VALUES_JSON when given, and prints the
                                               last manifest

helm-sdkpy exposes no `template`; an install against kube-sim renders with the same engine
(values checked against values.schema.json) and also proves the API server accepts every
object. Release records live in memory, so an upgrade runs in the same process.
"""

import asyncio
import json
import os
import sys

# Release records in memory: kube-sim answers JSON only, and client-go writes the release
# Secret as protobuf. (Set before the Go library loads; callers set it too.)
os.environ.setdefault("HELM_DRIVER", "memory")

import helm_sdkpy as helm  # noqa: E402


async def install(chart, kubeconfig, name, values, namespace, upgrade_values):
    config = helm.Configuration(namespace=namespace, kubeconfig=kubeconfig)
    release = await helm.Install(config).run(name, chart, values=values, wait=False)
    if upgrade_values is not None:
        release = await helm.Upgrade(config).run(name, chart, values=upgrade_values, wait=False)
    return release


def main(argv):
    if len(argv) >= 2 and argv[0] == "lint":
        result = asyncio.run(helm.Lint(helm.Configuration()).run(argv[1]))
        for m in result.get("Messages") or []:
            print(f"severity={m.get('Severity')} path={m.get('Path')} err={m.get('Err')}")
        errors = [m for m in result.get("Messages") or [] if m.get("Severity", 0) >= 3]
        return 1 if errors or result.get("Errors") else 0
    if 5 <= len(argv) <= 7 and argv[0] == "install":
        chart, kubeconfig, name, values = argv[1:5]
        namespace = argv[5] if len(argv) > 5 else "kube-system"
        upgrade = json.loads(argv[6]) if len(argv) > 6 else None
        release = asyncio.run(
            install(chart, kubeconfig, name, json.loads(values), namespace, upgrade)
        )
        sys.stdout.write(release["manifest"])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
