//! Standard output of the one-shot commands (`wal dump`, `ctl`, `demo`), whose reader may go
//! away (`tidelog wal dump | head -3`): that ends the command quietly and successfully, as a
//! signal would, rather than as a failure to explain.

/// Whether a write to stdout failed because its reader went away (a closed pipe).
pub fn reader_gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}
