//! `tidelog-applier`: the target side (DESIGN §5).

pub mod keys;
