//! The places for requests that wait on the safe time (a `trx_status` with a hint that is
//! not visible yet, a `safe_time` call with a target): each waits as an async task in a
//! place, holding no thread; when every place is taken a new one is refused
//! ([`Error::TooManyWaiters`]). A request answered without waiting takes none.

use std::sync::Arc;

use super::error::Error;

/// The most requests that may wait at once, by default.
pub const MAX_WAITERS: usize = 1024;

/// The places ([`MAX_WAITERS`] unless configured).
#[derive(Debug, Clone)]
pub struct WaitLimit {
    places: Arc<tokio::sync::Semaphore>,
    max: usize,
}

impl WaitLimit {
    pub fn new(max: usize) -> WaitLimit {
        WaitLimit {
            places: Arc::new(tokio::sync::Semaphore::new(max)),
            max,
        }
    }

    /// A place to wait in, held until the permit is dropped.
    pub fn enter(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Error> {
        self.places
            .clone()
            .try_acquire_owned()
            .map_err(|_| Error::TooManyWaiters { max: self.max })
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.max - self.places.available_permits()
    }

    /// The most that may wait at once.
    pub fn max(&self) -> usize {
        self.max
    }
}

impl Default for WaitLimit {
    fn default() -> Self {
        WaitLimit::new(MAX_WAITERS)
    }
}
