//! Sharing one simulated cloud between processes: [`SimServer`] serves a [`crate::SimCloud`]
//! over HTTP/JSON, [`RemoteSim`] is a provider that calls it.
//!
//! Two CCM processes (the leader-failover test) or a CCM child of `ccm bench` cannot share an
//! in-memory cloud; they can share a server. Each client sends its actor identity with every
//! request, so the server's mutation log tells the writers apart.

mod client;
mod lists;
mod server;
mod wire;

pub use client::RemoteSim;
pub use server::{SimServer, router, serve};
pub use wire::{ACTOR_HEADER, MAX_BATCH_HEADER};
