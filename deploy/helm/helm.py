"""Drives the Helm engine embedded in helm-sdkpy (Helm 4) for the chart tests.

    helm.py lint CHART                      -> prints lint messages, exit 1 on errors
    helm.py install CHART KUBECONFIG NAME VALUES_JSON
                                            -> installs into the cluster (release storage in
                                               memory, no waiting) and prints the manifest

helm-sdkpy exposes no `template`; an install against kube-sim renders with the same engine
and also proves the API server accepts every object.
"""

import asyncio
import json
import os
import sys

# Release records in memory: kube-sim answers JSON only, and client-go writes the release
# Secret as protobuf. (Set before the Go library loads; callers set it too.)
os.environ.setdefault("HELM_DRIVER", "memory")

import helm_sdkpy as helm  # noqa: E402


def main(argv):
    if len(argv) >= 2 and argv[0] == "lint":
        result = asyncio.run(helm.Lint(helm.Configuration()).run(argv[1]))
        for m in result.get("Messages") or []:
            print(f"severity={m.get('Severity')} path={m.get('Path')} err={m.get('Err')}")
        errors = [m for m in result.get("Messages") or [] if m.get("Severity", 0) >= 3]
        return 1 if errors or result.get("Errors") else 0
    if len(argv) == 5 and argv[0] == "install":
        chart, kubeconfig, name, values = argv[1:]
        config = helm.Configuration(namespace="kube-system", kubeconfig=kubeconfig)
        release = asyncio.run(
            helm.Install(config).run(name, chart, values=json.loads(values), wait=False)
        )
        sys.stdout.write(release["manifest"])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
