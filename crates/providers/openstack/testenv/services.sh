#!/usr/bin/env bash
# WORK IN PROGRESS, not run by the tests: registers and starts Placement, Glance and Nova (fake
# virt driver) next to a running Keystone and RabbitMQ. Servers boot; Nova's servers listing
# still answers 401 because its call to Neutron is refused. Neutron (ML2, no agents) needs
# MariaDB (its migrations fail on sqlite and PostgreSQL) and is started by hand so far: see
# docs/providers/openstack.md#tests. Usage: services.sh DIR KS_PORT RMQ_PORT PORT_BASE VENV
set -euo pipefail
DIR=$1; KS_PORT=$2; RMQ_PORT=$3; BASE=$4; VENV=$5
PL_PORT=$BASE; GL_PORT=$((BASE+1)); NOVA_PORT=$((BASE+2))
KS=http://127.0.0.1:$KS_PORT/v3
export OS_AUTH_URL=$KS OS_USERNAME=admin OS_PASSWORD=admin-secret OS_PROJECT_NAME=admin \
  OS_USER_DOMAIN_ID=default OS_PROJECT_DOMAIN_ID=default OS_IDENTITY_API_VERSION=3 OS_REGION_NAME=RegionOne
OS="$VENV/bin/openstack"
mkdir -p "$DIR/images" "$DIR/lock" "$DIR/nova"

authtoken() { # user password
  cat <<CONF
[keystone_authtoken]
www_authenticate_uri = $KS
auth_url = $KS
auth_type = password
project_name = service
project_domain_id = default
user_domain_id = default
username = $1
password = $2
region_name = RegionOne
CONF
}

# Keystone: the service project, service users, catalog entries; the cluster's project and user.
"$VENV/bin/python" - "$KS" "$PL_PORT" "$GL_PORT" "$NOVA_PORT" <<'PY'
import sys
from keystoneauth1 import session
from keystoneauth1.identity import v3
from keystoneclient.v3 import client
ks, pl, gl, nova = sys.argv[1:]
auth = v3.Password(auth_url=ks, username="admin", password="admin-secret", project_name="admin",
                   user_domain_id="default", project_domain_id="default")
c = client.Client(session=session.Session(auth=auth))
admin = c.roles.find(name="admin"); member = c.roles.find(name="member")
service = c.projects.create("service", "default")
for name in ("placement", "glance", "nova"):
    u = c.users.create(name, domain="default", password=name + "-secret")
    c.roles.grant(admin, user=u, project=service)
for name, typ, url in (("placement", "placement", f"http://127.0.0.1:{pl}"),
                       ("glance", "image", f"http://127.0.0.1:{gl}"),
                       ("nova", "compute", f"http://127.0.0.1:{nova}/v2.1")):
    s = c.services.create(name, type=typ)
    for iface in ("public", "internal"):
        c.endpoints.create(s, url, interface=iface, region="RegionOne")
p = c.projects.create("ccm", "default")
u = c.users.create("ccm", domain="default", password="ccm-secret", default_project=p)
c.roles.grant(member, user=u, project=p)
c.roles.grant(member, user=c.users.find(name="admin"), project=p)
PY

# Placement.
mkdir -p "$DIR/placement"
{ printf '[placement_database]\nconnection = sqlite:///%s/placement.db\n[api]\nauth_strategy = keystone\n' "$DIR"; authtoken placement placement-secret; } > "$DIR/placement/placement.conf"
"$VENV/bin/placement-manage" --config-file "$DIR/placement/placement.conf" db sync
printf 'import sys\nsys.argv = sys.argv[:1]\nfrom placement.wsgi.api import application  # noqa\n' > "$DIR/pl_wsgi.py"
OS_PLACEMENT_CONFIG_DIR="$DIR/placement" "$VENV/bin/gunicorn" --chdir "$DIR" -w 1 -b "127.0.0.1:$PL_PORT" \
  --pid "$DIR/placement.pid" --daemon --error-logfile "$DIR/placement.log" pl_wsgi:application

# Glance, images on the local filesystem.
{ printf '[DEFAULT]\nenabled_backends = fs:file\nbind_host = 127.0.0.1\nbind_port = %s\nlog_file = %s/glance.log\n[glance_store]\ndefault_backend = fs\n[fs]\nfilesystem_store_datadir = %s/images\n[database]\nconnection = sqlite:///%s/glance.db\n[paste_deploy]\nflavor = keystone\n[oslo_concurrency]\nlock_path = %s/lock\n' "$GL_PORT" "$DIR" "$DIR" "$DIR" "$DIR"; authtoken glance glance-secret; } > "$DIR/glance-api.conf"
"$VENV/bin/glance-manage" --config-file "$DIR/glance-api.conf" db_sync >/dev/null 2>&1
mkdir -p "$DIR/glance"; cp "$DIR/glance-api.conf" "$DIR/glance/glance-api.conf"; cp "$VENV/etc/glance/glance-api-paste.ini" "$DIR/glance/"
printf 'import sys\nsys.argv = sys.argv[:1]\nfrom glance.wsgi.api import application  # noqa\n' > "$DIR/gl_wsgi.py"
OS_GLANCE_CONFIG_DIR="$DIR/glance" "$VENV/bin/gunicorn" --chdir "$DIR" -w 1 -b "127.0.0.1:$GL_PORT" \
  --pid "$DIR/glance.pid" --daemon --error-logfile "$DIR/glance-gunicorn.log" gl_wsgi:application

# Nova: API, conductor, scheduler, and one compute host on the fake virt driver.
mkdir -p "$DIR/novaconf"; cp "$VENV/etc/nova/api-paste.ini" "$DIR/novaconf/"
{ cat <<CONF
[DEFAULT]
transport_url = rabbit://guest:guest@127.0.0.1:$RMQ_PORT/
compute_driver = fake.FakeDriver
state_path = $DIR/nova
host = ccm-compute-1
my_ip = 127.0.0.1
[api]
auth_strategy = keystone
[api_database]
connection = sqlite:///$DIR/nova_api.db
[database]
connection = sqlite:///$DIR/nova_cell1.db
[oslo_concurrency]
lock_path = $DIR/lock
[scheduler]
discover_hosts_in_cells_interval = 2
[placement]
auth_type = password
auth_url = $KS
project_name = service
project_domain_id = default
user_domain_id = default
username = nova
password = nova-secret
region_name = RegionOne
[glance]
region_name = RegionOne
[oslo_policy]
enforce_new_defaults = true
CONF
authtoken nova nova-secret; } > "$DIR/novaconf/nova.conf"
NM="$VENV/bin/nova-manage --config-file $DIR/novaconf/nova.conf"
$NM api_db sync
$NM cell_v2 map_cell0 --database_connection "sqlite:///$DIR/nova_cell0.db"
$NM cell_v2 create_cell --name cell1 >/dev/null
$NM db sync
printf 'import sys\nsys.argv = sys.argv[:1]\nfrom nova.wsgi.osapi_compute import application  # noqa\n' > "$DIR/nova_wsgi.py"
OS_NOVA_CONFIG_DIR="$DIR/novaconf" "$VENV/bin/gunicorn" --chdir "$DIR" -w 1 -b "127.0.0.1:$NOVA_PORT" \
  --pid "$DIR/nova-api.pid" --daemon --error-logfile "$DIR/nova-api.log" nova_wsgi:application
for svc in conductor scheduler compute; do
  "$VENV/bin/nova-$svc" --config-file "$DIR/novaconf/nova.conf" > "$DIR/nova-$svc.log" 2>&1 &
  echo $! > "$DIR/nova-$svc.pid"
done
