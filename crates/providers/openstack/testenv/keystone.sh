#!/usr/bin/env bash
# Prepares a real Keystone for the tests, state in $DIR: sqlite database, fernet keys, the
# bootstrap admin (catalog: identity in RegionOne, public+internal), a project "ccm" with a user
# "ccm" (member), an application credential of that user, and a trust from admin to ccm.
# Writes $DIR/ids.env (KS_APP_CRED_ID, KS_APP_CRED_SECRET, KS_TRUST_ID, KS_CCM_USER_ID) and
# $DIR/ks_wsgi.py; the caller serves it: OS_KEYSTONE_CONFIG_FILES=$DIR/keystone.conf
# gunicorn --chdir $DIR -b 127.0.0.1:$KS_PORT ks_wsgi:application
# Usage: keystone.sh DIR KS_PORT VENV [TOKEN_LIFETIME_SECONDS]
set -euo pipefail
DIR=$1; KS_PORT=$2; VENV=$3; LIFETIME=${4:-3600}
mkdir -p "$DIR/fernet" "$DIR/cred"
chmod 700 "$DIR/fernet" "$DIR/cred"
cat > "$DIR/keystone.conf" <<CONF
[DEFAULT]
log_file = $DIR/keystone.log
[database]
connection = sqlite:///$DIR/keystone.db
[identity]
# bcrypt's cost: Keystone's default (12) is a quarter of a CPU-second per password check, and
# every openstack command of the tests checks one; 4 is bcrypt's least.
password_hash_rounds = 4
[token]
provider = fernet
expiration = $LIFETIME
[fernet_tokens]
key_repository = $DIR/fernet
[credential]
key_repository = $DIR/cred
CONF
KM="$VENV/bin/keystone-manage --config-file $DIR/keystone.conf"
{
  $KM db_sync
  $KM fernet_setup --keystone-user "$(id -un)" --keystone-group "$(id -gn)"
  $KM credential_setup --keystone-user "$(id -un)" --keystone-group "$(id -gn)"
  $KM bootstrap --bootstrap-password admin-secret --bootstrap-region-id RegionOne \
    --bootstrap-public-url "http://127.0.0.1:$KS_PORT/v3" \
    --bootstrap-internal-url "http://localhost:$KS_PORT/v3"
} > "$DIR/keystone-manage.log" 2>&1
printf 'import sys\nsys.argv = sys.argv[:1]\nfrom keystone.wsgi.api import application  # noqa\n' > "$DIR/ks_wsgi.py"
# The project, user, application credential and trust go through the real API once it serves
# (populate.py, run by the caller after start-up).
cat > "$DIR/populate.py" <<'PY'
import sys
from keystoneauth1 import session
from keystoneauth1.identity import v3
from keystoneclient.v3 import client
url, out = sys.argv[1:]
admin = v3.Password(auth_url=url, username="admin", password="admin-secret", project_name="admin",
                    user_domain_id="default", project_domain_id="default")
c = client.Client(session=session.Session(auth=admin))
member = c.roles.find(name="member")
p = c.projects.create("ccm", "default")
u = c.users.create("ccm", domain="default", password="ccm-secret", default_project=p)
c.roles.grant(member, user=u, project=p)
admin_user = c.users.find(name="admin")
c.roles.grant(member, user=admin_user, project=p)
ccm = client.Client(session=session.Session(auth=v3.Password(
    auth_url=url, username="ccm", password="ccm-secret", project_name="ccm",
    user_domain_id="default", project_domain_id="default")))
cred = ccm.application_credentials.create(name="ccm-rs", user=u.id)
admin_on_ccm = client.Client(session=session.Session(auth=v3.Password(
    auth_url=url, username="admin", password="admin-secret", project_name="ccm",
    user_domain_id="default", project_domain_id="default")))
trust = admin_on_ccm.trusts.create(trustee_user=u.id, trustor_user=admin_user.id, project=p.id,
                                   role_ids=[member.id])
with open(out, "w") as f:
    f.write(f"KS_APP_CRED_ID={cred.id}\nKS_APP_CRED_SECRET={cred.secret}\n"
            f"KS_TRUST_ID={trust.id}\nKS_CCM_USER_ID={u.id}\n")
PY
