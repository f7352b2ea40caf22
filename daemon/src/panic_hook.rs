//! The daemons' panic hook: a panic is reported through `tracing` (the journal under
//! systemd), as an error naming the thread and, on an apply thread, the tablet it was
//! applying, with where it happened — never only as the standard library's message on
//! stderr. The hook only reports: what the panic means is decided where it is caught (an
//! apply step's panic stops that tablet, `apply_failed`).

use std::backtrace::{Backtrace, BacktraceStatus};

/// Installs the hook (once logging is set up). Where the log filter drops errors, the
/// standard library's hook still prints the panic.
pub fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !tracing::enabled!(tracing::Level::ERROR) {
            default(info);
            return;
        }
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("<unnamed>");
        let message = tidelog_applier::error::Error::panic_message(info.payload());
        let location = info
            .location()
            .map_or_else(String::new, |l| format!("{}:{}", l.file(), l.line()));
        match tidelog_applier::apply::current_tablet() {
            Some(tablet) => tracing::error!(
                thread,
                %tablet,
                location,
                "panic in thread {thread} applying tablet {tablet}: {message}"
            ),
            None => tracing::error!(thread, location, "panic in thread {thread}: {message}"),
        }
        // Captured only when RUST_BACKTRACE (or RUST_LIB_BACKTRACE) asks for it; a line of
        // its own, so the one above stays a single line with its fields.
        let bt = Backtrace::capture();
        if bt.status() == BacktraceStatus::Captured {
            tracing::error!(thread, "backtrace of the panic in thread {thread}:\n{bt}");
        }
    }));
}
