//! # ccm-provider-metal: bare metal, one CCM
//!
//! `--cloud-provider=metal` gives clusters on their own hardware what they used to stitch
//! together from a node initializer, kube-vip-cloud-provider or MetalLB, and static routes:
//! - **Instances** from a machine inventory in the cloud-config (reloaded when the file
//!   changes), providerID `metal://<machine>` (or the System's UUID / serial), power state
//!   from each machine's Redfish BMC, the System found through its Systems collection
//!   ([`redfish`]: only an answering collection without a System seen before is "gone";
//!   everything else a BMC does is an error, never "instance gone");
//! - **LoadBalancer IPs** from address pools ([`ipam`]): requested addresses (own, MetalLB and
//!   kube-vip annotations, `spec.loadBalancerIP`), sharing keys, dual-stack, state rebuilt from
//!   the cluster's Services, no silent renumbering; kube-vip's annotation kept within the
//!   status ([`kube_vip`]);
//! - **Routes**: pod CIDRs announced over BGP to the datacenter's routers by a BIRD 2 daemon
//!   ccm-rs supervises ([`bgp`]), or kernel routes (rtnetlink) in a dedicated table and
//!   protocol on the host the CCM runs on.
//!
//! The cloud-config reference and a full example are in `docs/providers/metal.md`.

pub mod bgp;
pub mod config;
mod events;
mod instances;
pub mod ipam;
pub mod kube_vip;
mod lb;
pub mod metrics;
pub mod netlink;
mod provider;
pub mod redfish;
mod routes;

pub use config::MetalConfig;
pub use lb::adoption_order;
pub use provider::{MetalCloud, PROVIDER_NAME, RELOAD_PERIOD, provider_id, register};
