//! `tidelog-applier`: the target side (DESIGN §5).

pub mod apply;
pub mod error;
pub mod keys;
pub mod store;
