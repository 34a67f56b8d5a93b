# kubectl: the kube-sim and doctor tests drive the real client (and its plugin mechanism).
if ! command -v kubectl >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || true
  apt-get install -y -qq kubectl >/dev/null 2>&1 || apt-get install -y -qq kubernetes-client >/dev/null 2>&1 || true
fi
if ! command -v kubectl >/dev/null 2>&1; then
  echo "FATAL: kubectl is missing and could not be installed; the kube-sim tests need the real kubectl binary" >&2
  exit 1
fi
kubectl version --client 2>/dev/null | sed -n 1p
