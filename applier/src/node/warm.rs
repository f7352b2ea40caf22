//! `trx_status` is typically asked right after a failure, often of this very applier: the
//! look-up keyspaces are loaded into the block cache in the background at start, when they
//! fit in three quarters of `cache-size` (more would only evict what it loads).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::store::Store;

/// Where pre-loading the `trx_status` look-up indexes stands (status `lookup_cache`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::FromRepr, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
#[repr(u8)]
pub enum WarmState {
    /// Nothing to load (an empty binlog).
    Empty = 0,
    Loading = 1,
    Loaded = 2,
    /// Larger than 3/4 of `cache-size`: not loaded.
    TooLarge = 3,
    Failed = 4,
}

impl WarmState {
    /// `empty`, `loading`, `loaded`, `too-large` or `failed`.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The state stored as `v` (`failed` for anything unknown).
    pub(crate) fn load(v: &AtomicU8) -> WarmState {
        WarmState::from_repr(v.load(Ordering::Acquire)).unwrap_or(WarmState::Failed)
    }
}

/// Starts loading the look-up indexes (see the module doc), reporting in `state`.
pub(crate) fn warm_lookup_cache(store: Arc<Store>, cache_size: u64, state: Arc<AtomicU8>) {
    let set = move |w: WarmState| state.store(w as u8, Ordering::Release);
    let bytes = store.lookup_index_bytes();
    if bytes == 0 {
        return;
    }
    if bytes > cache_size / 4 * 3 {
        tracing::info!(
            lookup_bytes = bytes,
            cache_size,
            "trx_status look-up indexes exceed 3/4 of cache-size: not pre-loading them (raise cache-size for µs look-ups)"
        );
        set(WarmState::TooLarge);
        return;
    }
    set(WarmState::Loading);
    let set2 = set.clone();
    let spawned = std::thread::Builder::new()
        .name("cache-warm".into())
        .spawn(move || {
            let t0 = std::time::Instant::now();
            match store.warm_lookup_cache() {
                Ok(n) => {
                    tracing::info!(
                        entries = n,
                        lookup_bytes = bytes,
                        took_ms = t0.elapsed().as_millis() as u64,
                        "trx_status look-up indexes loaded into the block cache"
                    );
                    set2(WarmState::Loaded);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pre-loading the look-up indexes failed");
                    set2(WarmState::Failed);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the cache-warm thread");
        set(WarmState::Failed);
    }
}
