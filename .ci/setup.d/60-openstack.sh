# OpenStack (ccm-provider-openstack): the tests start real OpenStack services from PyPI on
# 127.0.0.1 (crates/providers/openstack/testenv): Keystone, Nova on its fake virt driver,
# Neutron (ML2, no agents), Placement, Glance, Octavia (amphora provider on no-op drivers; for
# tests/neutron.rs), under gunicorn; RabbitMQ (Nova's and Octavia's messaging), MariaDB (Neutron
# no longer migrates on sqlite or PostgreSQL) and openssl (Octavia's test CA) from Debian. The Python services
# get their own venv, <repo>/.venv-openstack: their pins conflict with moto's.
# Measured on the dev machine: pip ~2.5 min from scratch, apt ~45 s; the whole stack is ready in
# ~95 s and holds ~650 MB RSS; Keystone alone starts in ~10 s. Octavia adds ~10 s of pip (its
# dependencies are the others'), ~45 s of start-up under load and ~440 MB RSS.
OPENSTACK_PINS=(
  "keystone==30.0.0" "nova==34.0.0" "neutron==29.0.0" "openstack-placement==16.0.0" "glance==33.0.0"
  "python-openstackclient==10.5.0" "python-keystoneclient==6.0.0" "gunicorn==23.0.0" "PyMySQL==1.1.2"
  "octavia==19.0.0" "python-octaviaclient==3.15.0"
)
OPENSTACK_VENV="${CCM_OPENSTACK_VENV:-$(dirname "$CCM_VENV")/.venv-openstack}"
if [ ! -x "$OPENSTACK_VENV/bin/python" ]; then
  python3 -m venv "$OPENSTACK_VENV"
fi
openstack_missing=0
for pin in "${OPENSTACK_PINS[@]}"; do
  "$OPENSTACK_VENV/bin/python" -m pip show "${pin%%==*}" 2>/dev/null | grep -qix "Version: ${pin##*==}" || openstack_missing=1
done
if [ "$openstack_missing" = 1 ]; then
  "$OPENSTACK_VENV/bin/python" -m pip install -q "${OPENSTACK_PINS[@]}"
fi
openstack_apt=()
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || openstack_apt+=(rabbitmq-server)
command -v mariadbd >/dev/null 2>&1 || openstack_apt+=(mariadb-server)
command -v openssl >/dev/null 2>&1 || openstack_apt+=(openssl)
if [ ${#openstack_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # No service is started: there is no init in CI containers, and the tests start their own.
  apt-get install -y -qq --no-install-recommends "${openstack_apt[@]}" >/dev/null
fi
"$OPENSTACK_VENV/bin/keystone-manage" --version >/dev/null 2>&1
"$OPENSTACK_VENV/bin/nova-manage" --version >/dev/null 2>&1
