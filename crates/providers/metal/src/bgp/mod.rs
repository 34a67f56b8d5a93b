//! BGP mode: pod CIDRs announced to the datacenter's routers by a supervised BIRD 2 daemon
//! that ccm-rs configures, only while it leads.

pub mod config;
