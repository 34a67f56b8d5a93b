# deploy/ (issue 15): schema validation of the manifests and a real Helm engine for the chart.
#   kubernetes-validate: the Kubernetes JSON schemas (1.36 among them), into the shared venv.
#   helm-sdkpy: Helm 4 embedded in a Python wheel; it needs Python >= 3.12, so it gets its own
#   venv ($CCM_VENV/helm) and `helm-python` in $CCM_VENV/bin runs that venv's python (a
#   wrapper, not a symlink: a venv's python found through a symlink takes the other venv).
KUBERNETES_VALIDATE_VERSION=1.37.0
HELM_SDKPY_VERSION=0.1.32

if ! "$CCM_VENV/bin/python" -m pip show kubernetes-validate 2>/dev/null | grep -qx "Version: $KUBERNETES_VALIDATE_VERSION"; then
  "$CCM_VENV/bin/python" -m pip install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi

find_python312() {
  for p in python3.13 python3.12; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$p"; return 0
    fi
  done
  for p in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
    if [ -x "$p" ]; then echo "$p"; return 0; fi
  done
  return 1
}

if [ ! -x "$CCM_VENV/helm/bin/python" ] || ! "$CCM_VENV/helm/bin/python" -m pip show helm-sdkpy 2>/dev/null | grep -qx "Version: $HELM_SDKPY_VERSION"; then
  if ! py312="$(find_python312)"; then
    echo "FATAL: helm-sdkpy needs Python >= 3.12 and none was found (python3.12 on PATH or under pyenv)" >&2
    exit 1
  fi
  "$py312" -m venv "$CCM_VENV/helm"
  "$CCM_VENV/helm/bin/python" -m pip install -q "helm-sdkpy==$HELM_SDKPY_VERSION"
fi
rm -f "$CCM_VENV/bin/helm-python"
printf '#!/bin/sh\nexec "%s/helm/bin/python" "$@"\n' "$CCM_VENV" > "$CCM_VENV/bin/helm-python"
chmod +x "$CCM_VENV/bin/helm-python"

# buildah (Debian): the container image test builds deploy/image/Containerfile with
# --isolation chroot --storage-driver vfs (no daemon, no registry access needed: FROM scratch).
if ! command -v buildah >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq buildah >/dev/null
fi
