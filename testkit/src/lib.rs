//! tidelog's test kit: helpers shared by the tests and the benchmarks, never by the daemons.
//!
//! Today it holds the UDP impairment proxy ([`impair`]): an in-process stand-in for a lossy,
//! slow, reordering WAN link between a shipper and an applier, because netem is not in
//! every kernel and needs privileges a test does not have.

pub mod api;
pub mod cluster;
pub mod fault_run;
pub mod http1;
pub mod impair;
pub mod load;
pub mod pki;
pub mod process;
pub mod session;

pub use api::Api;
pub use cluster::LocalCluster;
pub use impair::{DirStats, ImpairProxy, Impairment, ImpairmentError, ProxyStats};
pub use process::Daemon;
pub use session::{DistributedTxn, Session};
