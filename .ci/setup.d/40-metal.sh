# sushy-tools: the Redfish BMC emulator the metal provider's tests power machines on and off
# with. Its fake systems driver keeps machines in memory, so no libvirt is needed. Tests start
# `sushy-emulator` on 127.0.0.1 with a free port below the ephemeral range (a restarted emulator
# gets it back) and stop it when done.
SUSHY_TOOLS_VERSION=2.2.0
if ! "$CCM_VENV/bin/python" -m pip show sushy-tools 2>/dev/null | grep -qx "Version: $SUSHY_TOOLS_VERSION"; then
  "$CCM_VENV/bin/python" -m pip install --quiet "sushy-tools==$SUSHY_TOOLS_VERSION"
fi
sushy-emulator --help >/dev/null

# The metal provider's route test sends real packets between network namespaces (ping), its
# silent-BMC test runs the emulator in a network namespace behind a veth pair (ip), and its
# Redfish test drives the emulator's API with curl.
metal_need=()
command -v ping >/dev/null 2>&1 || metal_need+=(iputils-ping)
command -v ip >/dev/null 2>&1 || metal_need+=(iproute2)
command -v curl >/dev/null 2>&1 || metal_need+=(curl)
if [ ${#metal_need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${metal_need[@]}"
fi
