//! `tidelog-shipper`: tails tablet WALs and ships them to the applier (DESIGN §4).
