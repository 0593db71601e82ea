//! # comm-core
//!
//! The transport-independent core of weave: errors, configuration, bootstrap, registered
//! memory and its wire format, the [`Connection`](connection::Connection) trait, host
//! semaphores, the trigger FIFO and its proxy thread, memory and port channels, and the
//! [`Communicator`](communicator::Communicator) that sets them up between ranks.
//!
//! comm-core knows no transport but the in-process [`loopback`] one (for tests); transports live
//! in their own crates and plug in through [`transport::TransportFactory`].

pub mod agreement;
pub mod bootstrap;
pub mod carry_over;
pub mod communicator;
pub mod config;
pub mod connection;
pub mod crowding;
pub mod deadline;
mod debug_fields;
pub mod deferred;
pub mod device;
pub mod diagnostics;
pub mod doorbell;
mod endpoints;
pub mod error;
pub mod fifo;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod host;
pub mod ledger;
pub mod local_address;
#[cfg(all(test, loom))]
mod loom_models;
pub mod loopback;
pub mod memory;
pub mod memory_channel;
mod memory_descriptor;
pub mod notice;
pub mod peer_watch;
pub mod port_channel;
pub mod proxy;
mod registration;
pub mod resilience;
pub mod same_host;
pub mod semaphore;
pub mod slot_credits;
pub mod spin;
mod sync;
pub mod tcp_bounded;
pub mod tcp_listener;
pub mod testing;
pub mod topology;
pub mod transport;
pub mod transport_names;
pub mod trigger;
pub mod verdict;
pub mod wire;

pub use error::{Error, Result};
