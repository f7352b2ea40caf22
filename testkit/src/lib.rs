//! tidelog's test kit: helpers shared by the tests and the benchmarks, never by the daemons.
//!
//! Today it holds the UDP impairment proxy ([`impair`]): an in-process stand-in for a lossy,
//! slow, reordering WAN link between a shipper and an applier, because netem is not in
//! every kernel and needs privileges a test does not have.

pub mod impair;
pub mod load;
pub mod pki;
pub mod session;

pub use impair::{DirStats, ImpairProxy, Impairment, ImpairmentError, ProxyStats};
pub use session::{DistributedTxn, Session};
