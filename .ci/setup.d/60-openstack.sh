# OpenStack (ccm-provider-openstack): the tests start a real Keystone from PyPI on 127.0.0.1
# (sqlite database, fernet keys) under gunicorn. Its own venv, <repo>/.venv-openstack: the
# OpenStack pins conflict with moto's. Measured: ~1 min to install, Keystone ready in ~15 s,
# ~110 MB RSS. Nova, Neutron, Placement and Glance are not needed by the tests yet (see
# docs/providers/openstack.md); crates/providers/openstack/testenv/services.sh is the work in
# progress on them.
KEYSTONE_VERSION=30.0.0
GUNICORN_VERSION=23.0.0
OPENSTACK_VENV="${CCM_OPENSTACK_VENV:-$(dirname "$CCM_VENV")/.venv-openstack}"
if [ ! -x "$OPENSTACK_VENV/bin/python" ]; then
  python3 -m venv "$OPENSTACK_VENV"
fi
if ! "$OPENSTACK_VENV/bin/python" -m pip show keystone 2>/dev/null | grep -qx "Version: $KEYSTONE_VERSION" \
   || ! "$OPENSTACK_VENV/bin/python" -m pip show gunicorn 2>/dev/null | grep -qx "Version: $GUNICORN_VERSION" \
   || ! "$OPENSTACK_VENV/bin/python" -c "import keystoneclient" 2>/dev/null; then
  "$OPENSTACK_VENV/bin/python" -m pip install -q "keystone==$KEYSTONE_VERSION" "gunicorn==$GUNICORN_VERSION" \
    "python-keystoneclient==6.0.0"
fi
"$OPENSTACK_VENV/bin/keystone-manage" --version >/dev/null 2>&1
