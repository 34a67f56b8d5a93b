# moto: the AWS API emulator the ccm-provider-aws integration tests run against (EC2, ELB,
# ELBv2 in server mode). Pinned; a second run on the same machine is a no-op. The tests start
# `moto_server` on 127.0.0.1 with an ephemeral port themselves.
MOTO_VERSION=5.2.5
if ! "$CCM_VENV/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null \
   || [ ! -x "$CCM_VENV/bin/moto_server" ]; then
  "$CCM_VENV/bin/pip" install -q "moto[server]==$MOTO_VERSION"
fi
"$CCM_VENV/bin/moto_server" --help >/dev/null
