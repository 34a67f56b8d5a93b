# Boots COUNT servers named PREFIX-… on the stack's fake Nova (in requests of at most 50), waits
# for them (WAIT = "active": ACTIVE; "listed": listed, whatever their state, for fleets larger
# than the one fake compute host builds in a test's time), gives each a Neutron port on NETWORK
# (device_id = the server, as Nova's own ports) and prints one JSON line:
# [{"name", "id", "ip"}, ...].
# Usage: python fleet.py AUTH_URL PREFIX COUNT NETWORK_ID WAIT
import json
import sys
import time

import openstack

auth_url, prefix, count, network, wait = sys.argv[1:6]
count = int(count)
conn = openstack.connect(
    auth_url=auth_url, username="ccm", password="ccm-secret", project_name="ccm",
    user_domain_id="default", project_domain_id="default", region_name="RegionOne",
)
flavor = conn.compute.find_flavor("m1.small", ignore_missing=False)
image = conn.image.find_image("tiny", ignore_missing=False)


def ours():
    return [s for s in conn.compute.servers(name=f"^{prefix}-") if s.name.startswith(prefix + "-")]


left, chunk = count, 0
while left > 0:
    n = min(left, 50)
    # One request for n servers; Nova names them <name>-1 .. <name>-n.
    conn.compute.create_server(
        name=f"{prefix}-c{chunk}", flavor_id=flavor.id, image_id=image.id,
        networks="none", min_count=n, max_count=n,
    )
    left, chunk = left - n, chunk + 1
deadline = time.time() + 120 + 2 * count
while True:
    servers = ours()
    states = [s.status for s in servers]
    if len(servers) >= count and (wait == "listed" or all(s == "ACTIVE" for s in states)):
        break
    bad = [s for s in servers if s.status == "ERROR"]
    if bad or time.time() > deadline:
        sys.exit(f"servers not ACTIVE: {len(servers)} listed, {states.count('ACTIVE')} active, "
                 f"{len(bad)} in ERROR")
    time.sleep(2)
servers.sort(key=lambda s: s.name)
out = []
for i in range(0, len(servers), 25):
    batch = servers[i:i + 25]
    ports = conn.network.create_ports([
        {"network_id": network, "device_id": s.id, "device_owner": "compute:nova",
         "name": f"port-{s.name}"} for s in batch
    ])
    for s, p in zip(batch, ports):
        out.append({"name": s.name, "id": s.id, "ip": p.fixed_ips[0]["ip_address"]})
print(json.dumps(out))
