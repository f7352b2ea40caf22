//! `tidelog-applier`: the target side (DESIGN §5).
