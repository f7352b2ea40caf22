//! `tidelog-proto`: the protocol between a shipper and an applier's intake, as a fully
//! deterministic implementation of its logic. It contains no networking code, no async
//! runtime and no clock of its own: the wire codec ([`wire`]) turns messages into bytes and
//! back, and callers feed what arrives and the time, and perform what comes out.

pub mod wire;
