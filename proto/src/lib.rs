//! `tidelog-proto`: the protocol between a shipper and an applier's intake, as a fully
//! deterministic implementation of its logic. It contains no networking code, no async
//! runtime and no clock of its own: callers feed it the bytes their streams deliver and
//! the time, and perform what it returns (send bytes, read the WAL, queue a frame for the
//! received log), in the manner of quinn-proto's `Connection`.
//!
//! * [`wire`]: the message codec (byte layouts in `wal/FORMAT.md`, "Wire protocol");
//! * [`decode`]: whole messages out of a stream's bytes;
//! * [`ship`]: the shipper's control stream and per-tablet stream (window, acks, resume);
//! * [`intake`]: the intake's claims, its answer to a Hello, and a tablet stream that acks
//!   only what is durable;
//! * [`backoff`]: the capped exponential backoff of reconnects and stream reopens.
//!
//! `tests/sim/` drives both ends through an in-memory network with a virtual clock and
//! seeded faults (docs/ARCHITECTURE.md, "The protocol core and its simulation").

pub mod backoff;
pub mod decode;
pub mod intake;
pub mod ship;
pub mod wire;
