#!/usr/bin/env bash
# A real OpenStack on 127.0.0.1 for the tests: Keystone (sqlite), RabbitMQ and MariaDB (Debian),
# Placement and Glance (sqlite), Neutron (ML2, no agents; MariaDB: its migrations need MySQL),
# Nova (API, conductor, scheduler, one compute on the fake virt driver; MariaDB); with a fourth
# argument `octavia`, Octavia too (API and controller worker, amphora provider on its no-op
# compute and amphora drivers; MariaDB) and an external network `public` for floating IPs.
# Writes $DIR/stack.env, prints READY, and runs until its stdin closes; then stops everything.
# Usage: stack.sh DIR PORT_BASE VENV [octavia]   (uses ports PORT_BASE .. PORT_BASE+9)
set -euo pipefail
DIR=$1; BASE=$2; VENV=$3; WITH_OCTAVIA=${4:-}
HERE=$(cd "$(dirname "$0")" && pwd)
KS_PORT=$BASE; RMQ=$((BASE+1)); RMQ_DIST=$((BASE+2)); EPMD=$((BASE+3)); PL=$((BASE+4))
GL=$((BASE+5)); NOVA=$((BASE+6)); NET=$((BASE+7)); DB=$((BASE+8)); OCT=$((BASE+9))
[ "$WITH_OCTAVIA" = octavia ] || OCT=""
KS=http://127.0.0.1:$KS_PORT/v3
PIDS=()
cleanup() {
  for f in "$DIR"/*.gpid; do [ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -e "$DIR/mysql.pid" ] && kill "$(cat "$DIR/mysql.pid")" 2>/dev/null
  RABBITMQ_NODENAME=ccm$BASE@localhost ERL_EPMD_PORT=$EPMD HOME=$DIR/rmq \
    timeout 20 /usr/lib/rabbitmq/bin/rabbitmqctl -q stop >/dev/null 2>&1 || true
  [ -n "${EPMD_PID:-}" ] && kill "$EPMD_PID" 2>/dev/null
  wait 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$DIR/rmq/mnesia" "$DIR/rmq/log" "$DIR/lock" "$DIR/nova" "$DIR/images" "$DIR/logs"
waitport() { for _ in $(seq 240); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.25; done; echo "port $1 never opened" >&2; return 1; }
wsgi() { # name port module env...
  local name=$1 port=$2 module=$3; shift 3
  printf 'import sys\nsys.argv = sys.argv[:1]\nfrom %s import application  # noqa\n' "$module" > "$DIR/${name}_wsgi.py"
  # Request lines up to Apache's default (8190): listing many servers, Nova asks Neutron for
  # their ports by a long list of device ids. A bulk request may take minutes on a loaded host.
  env "$@" "$VENV/bin/gunicorn" --chdir "$DIR" -w 1 -b "127.0.0.1:$port" --daemon --pid "$DIR/$name.gpid" \
    --limit-request-line 8190 --timeout 300 \
    --capture-output --error-logfile "$DIR/logs/$name.log" "${name}_wsgi:application"
}
authtoken() {
  printf '[keystone_authtoken]\nwww_authenticate_uri = %s\nauth_url = %s\nauth_type = password\nproject_name = service\nproject_domain_id = default\nuser_domain_id = default\nusername = %s\npassword = %s-secret\nregion_name = RegionOne\n' "$KS" "$KS" "$1" "$1"
}
creds() { # section user
  printf '[%s]\nauth_type = password\nauth_url = %s\nproject_name = service\nproject_domain_id = default\nuser_domain_id = default\nusername = %s\npassword = %s-secret\nregion_name = RegionOne\n' "$1" "$KS" "$2" "$2"
}

# Brokers and databases first: they start while Keystone bootstraps.
/usr/bin/epmd -port "$EPMD" > "$DIR/logs/epmd.log" 2>&1 & EPMD_PID=$!
echo '[].' > "$DIR/rmq/enabled_plugins"; echo 'loopback_users = none' > "$DIR/rmq/rabbitmq.conf"
RABBITMQ_NODENAME=ccm$BASE@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$RMQ \
RABBITMQ_DIST_PORT=$RMQ_DIST RABBITMQ_MNESIA_BASE=$DIR/rmq/mnesia RABBITMQ_LOG_BASE=$DIR/rmq/log \
RABBITMQ_CONFIG_FILE=$DIR/rmq/rabbitmq RABBITMQ_ENABLED_PLUGINS_FILE=$DIR/rmq/enabled_plugins \
RABBITMQ_ADVANCED_CONFIG_FILE=$DIR/rmq/advanced.config HOME=$DIR/rmq ERL_EPMD_PORT=$EPMD \
  /usr/lib/rabbitmq/bin/rabbitmq-server > "$DIR/logs/rabbitmq.log" 2>&1 & PIDS+=($!)
mariadb-install-db --no-defaults --datadir="$DIR/mysql" --user="$(id -un)" --auth-root-authentication-method=normal \
  --skip-test-db > "$DIR/logs/mariadb-install.log" 2>&1
mariadbd --no-defaults --datadir="$DIR/mysql" --user="$(id -un)" --bind-address=127.0.0.1 --port="$DB" \
  --socket="$DIR/mysql.sock" --pid-file="$DIR/mysql.pid" --innodb-flush-log-at-trx-commit=0 \
  --innodb-buffer-pool-size=32M --skip-log-bin > "$DIR/logs/mariadb.log" 2>&1 & PIDS+=($!)

# Keystone, with the cluster's project, user, application credential and trust.
bash "$HERE/keystone.sh" "$DIR" "$KS_PORT" "$VENV" 3600
wsgi ks "$KS_PORT" keystone.wsgi.api OS_KEYSTONE_CONFIG_FILES="$DIR/keystone.conf"
waitport "$KS_PORT"
"$VENV/bin/python" "$DIR/populate.py" "$KS" "$DIR/ids.env"
"$VENV/bin/python" - "$KS" "$PL" "$GL" "$NOVA" "$NET" "$OCT" <<'PY'
import sys
from keystoneauth1 import session
from keystoneauth1.identity import v3
from keystoneclient.v3 import client
ks, pl, gl, nova, net, octavia = sys.argv[1:]
c = client.Client(session=session.Session(auth=v3.Password(
    auth_url=ks, username="admin", password="admin-secret", project_name="admin",
    user_domain_id="default", project_domain_id="default")))
admin, svc_role = c.roles.find(name="admin"), c.roles.find(name="service")
service = c.projects.create("service", "default")
services = [("placement", "placement", f"http://127.0.0.1:{pl}"),
            ("glance", "image", f"http://127.0.0.1:{gl}"),
            ("nova", "compute", f"http://127.0.0.1:{nova}/v2.1"),
            ("neutron", "network", f"http://127.0.0.1:{net}")]
if octavia:
    services.append(("octavia", "load-balancer", f"http://127.0.0.1:{octavia}"))
    # Octavia's policy: load balancers need load-balancer_member (as deployments grant it).
    lbm = c.roles.create("load-balancer_member")
    c.roles.grant(lbm, user=c.users.find(name="ccm"), project=c.projects.find(name="ccm"))
for name, _, _ in services:
    u = c.users.create(name, domain="default", password=name + "-secret")
    c.roles.grant(admin, user=u, project=service)
    c.roles.grant(svc_role, user=u, project=service)
for name, typ, url in services:
    s = c.services.create(name, type=typ)
    for iface in ("public", "internal"):
        c.endpoints.create(s, url, interface=iface, region="RegionOne")
PY

# Placement and Glance.
mkdir -p "$DIR/placement" "$DIR/glance"
{ printf '[placement_database]\nconnection = sqlite:///%s/placement.db\n[api]\nauth_strategy = keystone\n' "$DIR"; authtoken placement; } > "$DIR/placement/placement.conf"
"$VENV/bin/placement-manage" --config-file "$DIR/placement/placement.conf" db sync > "$DIR/logs/placement-db.log" 2>&1
wsgi placement "$PL" placement.wsgi.api OS_PLACEMENT_CONFIG_DIR="$DIR/placement"
{ printf '[DEFAULT]\nenabled_backends = fs:file\n[glance_store]\ndefault_backend = fs\n[fs]\nfilesystem_store_datadir = %s/images\n[database]\nconnection = sqlite:///%s/glance.db\n[paste_deploy]\nflavor = keystone\n[oslo_concurrency]\nlock_path = %s/lock\n' "$DIR" "$DIR" "$DIR"; authtoken glance; } > "$DIR/glance/glance-api.conf"
cp "$VENV/etc/glance/glance-api-paste.ini" "$DIR/glance/"
"$VENV/bin/glance-manage" --config-file "$DIR/glance/glance-api.conf" db_sync > "$DIR/logs/glance-db.log" 2>&1
wsgi glance "$GL" glance.wsgi.api OS_GLANCE_CONFIG_DIR="$DIR/glance"

# Neutron: ML2 without agents (networks, ports, routers as API objects).
mkdir -p "$DIR/neutron"
for _ in $(seq 120); do mariadb -uroot -h127.0.0.1 -P"$DB" -e "create database if not exists neutron" 2>/dev/null && break; sleep 0.25; done
for _ in $(seq 240); do grep -q "completed with" "$DIR/logs/rabbitmq.log" && break; sleep 0.25; done
TRANSPORT=rabbit://guest:guest@127.0.0.1:$RMQ/
{ printf '[DEFAULT]\ncore_plugin = ml2\nservice_plugins = router\nauth_strategy = keystone\ntransport_url = %s\nnotify_nova_on_port_status_changes = false\nnotify_nova_on_port_data_changes = false\n[database]\nconnection = mysql+pymysql://root@127.0.0.1:%s/neutron\n[oslo_concurrency]\nlock_path = %s/lock\n' "$TRANSPORT" "$DB" "$DIR"; authtoken neutron; } > "$DIR/neutron/neutron.conf"
printf '[ml2]\ntype_drivers = flat,vxlan\ntenant_network_types = vxlan\nmechanism_drivers =\nextension_drivers = port_security\n[ml2_type_vxlan]\nvni_ranges = 1:1000\n[ml2_type_flat]\nflat_networks = *\n' > "$DIR/neutron/ml2_conf.ini"
cp "$VENV/etc/neutron/api-paste.ini" "$DIR/neutron/"
"$VENV/bin/neutron-db-manage" --config-file "$DIR/neutron/neutron.conf" --config-file "$DIR/neutron/ml2_conf.ini" upgrade head > "$DIR/logs/neutron-db.log" 2>&1
wsgi neutron "$NET" neutron.wsgi.api OS_NEUTRON_CONFIG_DIR="$DIR/neutron" OS_NEUTRON_CONFIG_FILES="$DIR/neutron/neutron.conf;$DIR/neutron/ml2_conf.ini"

# Nova, on MariaDB: on sqlite, concurrent builds fail with "database is locked".
mkdir -p "$DIR/novaconf"; cp "$VENV/etc/nova/api-paste.ini" "$DIR/novaconf/"
MY=mysql+pymysql://root@127.0.0.1:$DB
mariadb -uroot -h127.0.0.1 -P"$DB" -e "create database nova_api; create database nova_cell0; create database nova"
{ printf '[DEFAULT]\ntransport_url = %s\ncompute_driver = fake.FakeDriver\nstate_path = %s/nova\nhost = ccm-compute-1\nmy_ip = 127.0.0.1\nlog_dir = %s/logs\n[api]\nauth_strategy = keystone\n[api_database]\nconnection = %s/nova_api\n[database]\nconnection = %s/nova\n[oslo_concurrency]\nlock_path = %s/lock\n[scheduler]\ndiscover_hosts_in_cells_interval = 2\n[glance]\nregion_name = RegionOne\n' "$TRANSPORT" "$DIR" "$DIR" "$MY" "$MY" "$DIR"
  authtoken nova; creds placement nova; creds neutron neutron; creds service_user nova; echo "send_service_user_token = true"; } > "$DIR/novaconf/nova.conf"
NM="$VENV/bin/nova-manage --config-file $DIR/novaconf/nova.conf"
{ $NM api_db sync; $NM cell_v2 map_cell0 --database_connection "$MY/nova_cell0"; $NM cell_v2 create_cell --name cell1; $NM db sync; } > "$DIR/logs/nova-db.log" 2>&1
wsgi nova "$NOVA" nova.wsgi.osapi_compute OS_NOVA_CONFIG_DIR="$DIR/novaconf"
for svc in conductor scheduler compute; do
  "$VENV/bin/nova-$svc" --config-file "$DIR/novaconf/nova.conf" > "$DIR/logs/nova-$svc.out" 2>&1 & PIDS+=($!)
done
for p in "$PL" "$GL" "$NET" "$NOVA"; do waitport "$p"; done

# Octavia: the API allocates VIP ports in the real Neutron (allowed_address_pairs driver); the
# worker builds amphorae on the no-op compute, network and amphora drivers, so a load balancer
# goes ACTIVE with a real VIP port and no VM. Flows run in the worker (no jobboard).
if [ -n "$OCT" ]; then
  mkdir -p "$DIR/octavia"
  # The worker signs each (no-op) amphora's certificate: a throwaway CA.
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$DIR/octavia/ca.key" -out "$DIR/octavia/ca.pem" \
    -days 2 -subj /CN=ccm-octavia-test > "$DIR/logs/octavia-ca.log" 2>&1
  mariadb -uroot -h127.0.0.1 -P"$DB" -e "create database if not exists octavia"
  octavia_conf() { # network_driver
    printf '[DEFAULT]\ntransport_url = %s\n[api_settings]\nauth_strategy = keystone\ndefault_provider_driver = amphora\nenabled_provider_drivers = amphora:Amphora on no-op drivers\n[database]\nconnection = mysql+pymysql://root@127.0.0.1:%s/octavia\n[controller_worker]\namphora_driver = amphora_noop_driver\ncompute_driver = compute_noop_driver\nnetwork_driver = %s\nloadbalancer_topology = SINGLE\namp_image_tag = amphora\namp_flavor_id = 1\namp_boot_network_list = 00000000-0000-0000-0000-000000000000\nclient_ca = %s/octavia/ca.pem\n[task_flow]\njobboard_enabled = False\n[oslo_messaging]\ntopic = octavia_prov\n[oslo_concurrency]\nlock_path = %s/lock\n[certificates]\ncert_manager = noop_cert_manager\nca_certificate = %s/octavia/ca.pem\nca_private_key = %s/octavia/ca.key\n[neutron]\nregion_name = RegionOne\nvalid_interfaces = public\n' "$TRANSPORT" "$DB" "$1" "$DIR" "$DIR" "$DIR" "$DIR"
    authtoken octavia; creds service_auth octavia
  }
  octavia_conf allowed_address_pairs_driver > "$DIR/octavia/api.conf"
  # Octavia's default request body limit (112 KiB) refuses an LB or member update carrying more
  # than about 1,000 members; OCTAVIA_MAX_BODY raises it, as operators of large clusters do.
  [ -z "${OCTAVIA_MAX_BODY:-}" ] || printf '[oslo_middleware]\nmax_request_body_size = %s\n' "$OCTAVIA_MAX_BODY" >> "$DIR/octavia/api.conf"
  octavia_conf network_noop_driver > "$DIR/octavia/worker.conf"
  "$VENV/bin/octavia-db-manage" --config-file "$DIR/octavia/api.conf" upgrade head > "$DIR/logs/octavia-db.log" 2>&1
  # The config file on the command line: keystonemiddleware does not see OS_OCTAVIA_CONFIG_FILES.
  printf 'import sys\nsys.argv = [sys.argv[0], "--config-file", "%s/octavia/api.conf"]\nfrom octavia.wsgi.api import application  # noqa\n' "$DIR" > "$DIR/octavia_wsgi.py"
  "$VENV/bin/gunicorn" --chdir "$DIR" -w 1 -b "127.0.0.1:$OCT" --daemon --pid "$DIR/octavia.gpid" \
    --capture-output --error-logfile "$DIR/logs/octavia.log" octavia_wsgi:application
  "$VENV/bin/octavia-worker" --config-file "$DIR/octavia/worker.conf" > "$DIR/logs/octavia-worker.out" 2>&1 & PIDS+=($!)
  waitport "$OCT"
fi

# A flavor and an image to boot from (as admin); wait for the compute host to be mapped.
export OS_AUTH_URL=$KS OS_USERNAME=admin OS_PASSWORD=admin-secret OS_PROJECT_NAME=admin \
  OS_USER_DOMAIN_ID=default OS_PROJECT_DOMAIN_ID=default OS_IDENTITY_API_VERSION=3 OS_REGION_NAME=RegionOne
head -c 1024 /dev/zero > "$DIR/image.raw"
"$VENV/bin/openstack" image create --file "$DIR/image.raw" --disk-format raw --container-format bare --public tiny >/dev/null
"$VENV/bin/openstack" flavor create --ram 512 --disk 1 --vcpus 1 m1.small >/dev/null
for _ in $(seq 120); do
  $NM cell_v2 discover_hosts >/dev/null 2>&1
  $NM cell_v2 list_hosts 2>/dev/null | grep -q ccm-compute-1 && break
  sleep 0.5
done
cat > "$DIR/stack.env" <<ENV
OS_AUTH_URL=$KS
NOVA_URL=http://127.0.0.1:$NOVA/v2.1
ENV
if [ -n "$OCT" ]; then
  # The external network floating IPs come from (admin-made, as in a real cloud).
  PUBLIC_NET=$("$VENV/bin/openstack" network create --external --provider-network-type flat \
    --provider-physical-network public -f value -c id public)
  "$VENV/bin/openstack" subnet create --network public --subnet-range 172.24.4.0/24 --no-dhcp public-sub >/dev/null
  printf 'OCTAVIA_URL=http://127.0.0.1:%s\nPUBLIC_NET_ID=%s\n' "$OCT" "$PUBLIC_NET" >> "$DIR/stack.env"
fi
echo READY
cat > /dev/null
