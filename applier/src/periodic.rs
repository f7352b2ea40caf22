//! A background thread that runs a piece of work at a fixed interval until dropped — the
//! shape of the applier's retention jobs (binlog, received logs).

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Runs `work` at once and then every `every`; dropping it wakes the thread and joins it
/// (after the round in progress, if any).
#[derive(Debug)]
pub(crate) struct Periodic {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl Periodic {
    pub(crate) fn start(
        name: &str,
        every: Duration,
        mut work: impl FnMut() + Send + 'static,
    ) -> std::io::Result<Periodic> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                work();
                let (m, cv) = &*stop2;
                let g = m.lock().unwrap_or_else(|p| p.into_inner());
                let (g, _) = cv
                    .wait_timeout_while(g, every, |stopped| !*stopped)
                    .unwrap_or_else(|p| p.into_inner());
                if *g {
                    return;
                }
            })?;
        Ok(Periodic {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for Periodic {
    fn drop(&mut self) {
        let (m, cv) = &*self.stop;
        *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
