//! # ccm-provider-openstack: Keystone v3, batched Nova instances, routes, Octavia load balancers
//!
//! `--cloud-provider=openstack` for ccm-rs, a drop-in for kubernetes/cloud-provider-openstack's
//! openstack-cloud-controller-manager: the same `cloud.conf` (gcfg INI, with `use-clouds` and
//! clouds.yaml), the same providerIDs (`openstack:///<server-id>`, or
//! `openstack://<region>/<server-id>` with `OS_CCM_REGIONAL=true`), the same Node addresses.
//!
//! It differs where ccm-rs does better: a batch of Nodes is answered by one Nova servers
//! listing (1,000 servers a page) and one Neutron ports call per 50 servers, where upstream
//! makes a GET per Node; and a Node is called gone only when Nova itself says its server is
//! (its 404 for that id, after a complete listing). Routes are Neutron extraroutes on
//! `[Route] router-id`, added and removed atomically. Load balancers are Octavia's, named and laid
//! out as upstream's so existing ones are adopted in place; see docs/providers/openstack.md.
//!
//! HTTP is hyper with rustls on ring, as the rest of the workspace, rather than openstack_sdk:
//! that SDK brings reqwest 0.13 (aws-lc by default), a config loader, a disk token cache and
//! every OpenStack service's generated API, for the dozen calls this provider makes.

mod addresses;
mod cloud;
mod clouds;
pub mod config;
pub mod http;
mod instances;
pub mod keystone;
pub mod lbopts;
mod nova;
pub mod octavia;
mod routes;
pub mod secgroup;
mod secret;

pub use cloud::{OpenStackCloud, PROVIDER_NAME, REGIONAL_PROVIDER_ID_ENV, register};
pub use config::{KeyStatus, OpenStackConfig};
pub use instances::{STATUS_SHUTOFF, provider_id, server_id};
pub use nova::{COMPUTE_MICROVERSION, PAGE_SIZE, PORTS_PER_CALL};
pub use routes::{EXT_ATOMIC, EXT_PAIRS, EXT_TAGS, MAX_TAG_LEN, next_hop, route_tag};
pub use secret::Secret;

/// The Nova and Neutron calls and the address mapping, for the fuzz targets (`fuzz/`,
/// docs/fuzzing.md) that feed them a cloud's answers. Not an API.
#[doc(hidden)]
pub use addresses::node_addresses;
#[doc(hidden)]
pub use nova::{Port, Server, get_server, list_servers, ports_of};
