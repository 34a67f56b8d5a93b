# sushy-tools: the Redfish BMC emulator the metal provider's tests power machines on and off
# with. Its fake systems driver keeps machines in memory, so no libvirt is needed. Tests start
# `sushy-emulator` on 127.0.0.1 with an ephemeral port and stop it when done.
SUSHY_TOOLS_VERSION=2.2.0
if ! "$CCM_VENV/bin/python" -m pip show sushy-tools 2>/dev/null | grep -qx "Version: $SUSHY_TOOLS_VERSION"; then
  "$CCM_VENV/bin/python" -m pip install --quiet "sushy-tools==$SUSHY_TOOLS_VERSION"
fi
sushy-emulator --help >/dev/null
