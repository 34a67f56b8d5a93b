# promtool (issue 12): the metrics test runs the real `promtool check metrics` on a running
# CCM's /metrics. Debian's `prometheus` package ships it (bookworm: 2.42). --no-install-recommends
# keeps the web UI assets and exporters out; no service is started in a container without init.
if ! command -v promtool >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
promtool --version 2>&1 | sed -n 1p
