# BIRD 2, the routing daemon the metal provider's BGP mode runs as a supervised child and its
# tests run as the datacenter "router" in a network namespace (real BGP sessions, real packets).
# Pinned to the Debian bookworm version; apt cannot pin older ones once the archive moves on,
# so a machine with another bird2 keeps it and says so.
BIRD_VERSION=2.0.12-7
bird_have=$(dpkg-query -W -f='${Version}' bird2 2>/dev/null || true)
if [ -z "$bird_have" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "bird2=$BIRD_VERSION" ||
    apt-get install -y -qq --no-install-recommends bird2
  bird_have=$(dpkg-query -W -f='${Version}' bird2)
fi
[ "$bird_have" = "$BIRD_VERSION" ] || echo "note: bird2 $bird_have installed (pinned: $BIRD_VERSION)"
# The package's own service would listen on this machine; tests start their own daemons.
if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled bird >/dev/null 2>&1; then
  systemctl disable --now bird >/dev/null 2>&1 || true
fi
bird --version 2>&1 | grep -q "^BIRD version 2"
