//! `HybridTime` and a clock that hands out strictly increasing hybrid times.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ParseError;

/// Bits of the logical counter below the physical microseconds.
pub const LOGICAL_BITS: u32 = 12;
const LOGICAL_MASK: u64 = (1 << LOGICAL_BITS) - 1;

/// `physical_microseconds_since_epoch << 12 | logical`.
///
/// Displayed and parsed as a decimal u64 (the form JSON carries as a string, since values
/// exceed 2^53).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HybridTime(pub u64);

impl HybridTime {
    pub const MIN: HybridTime = HybridTime(0);
    pub const MAX: HybridTime = HybridTime(u64::MAX);

    pub fn new(physical_micros: u64, logical: u16) -> HybridTime {
        HybridTime((physical_micros << LOGICAL_BITS) | (logical as u64 & LOGICAL_MASK))
    }

    pub fn from_system_time(t: SystemTime) -> HybridTime {
        let micros = t
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        HybridTime::new(micros, 0)
    }

    pub fn physical_micros(self) -> u64 {
        self.0 >> LOGICAL_BITS
    }

    pub fn logical(self) -> u16 {
        (self.0 & LOGICAL_MASK) as u16
    }

    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.physical_micros())
    }

    pub fn get(self) -> u64 {
        self.0
    }

    /// The next representable hybrid time.
    pub fn next(self) -> HybridTime {
        HybridTime(self.0.saturating_add(1))
    }
}

impl fmt::Display for HybridTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for HybridTime {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(ParseError::new("hybrid time", s, "empty"));
        }
        if !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseError::new(
                "hybrid time",
                s,
                "expected a decimal u64 (physical_us << 12 | logical)",
            ));
        }
        s.parse::<u64>()
            .map(HybridTime)
            .map_err(|_| ParseError::new("hybrid time", s, "out of range for u64"))
    }
}

impl Serialize for HybridTime {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HybridTime {
    /// Accepts a decimal string or a non-negative integer.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = HybridTime;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a hybrid time as a decimal string or a non-negative integer")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<HybridTime, E> {
                Ok(HybridTime(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<HybridTime, E> {
                u64::try_from(v)
                    .map(HybridTime)
                    .map_err(|_| E::custom(format!("hybrid time {v} is negative")))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<HybridTime, E> {
                Err(E::custom(format!(
                    "hybrid time {v} is not an integer; send it as a decimal string"
                )))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<HybridTime, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A hybrid clock: `now()` never returns the same value twice and never goes backwards, even
/// when the wall clock does. Shared between threads.
#[derive(Debug, Default)]
pub struct HybridClock {
    last: AtomicU64,
}

impl HybridClock {
    pub fn new() -> Self {
        HybridClock::default()
    }

    /// A clock that will never hand out anything at or below `floor` (e.g. the last ht found
    /// in a recovered log).
    pub fn starting_after(floor: HybridTime) -> Self {
        HybridClock {
            last: AtomicU64::new(floor.0),
        }
    }

    /// Strictly greater than every value this clock returned before.
    pub fn now(&self) -> HybridTime {
        let physical = HybridTime::from_system_time(SystemTime::now()).0;
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let next = physical.max(last + 1);
            match self
                .last
                .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return HybridTime(next),
                Err(seen) => last = seen,
            }
        }
    }

    /// Move the clock past `ht` (e.g. an ht received from elsewhere).
    pub fn observe(&self, ht: HybridTime) {
        self.last.fetch_max(ht.0, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        let ht = HybridTime::new(1_700_000_000_000_000, 7);
        assert_eq!(ht.to_string().parse::<HybridTime>(), Ok(ht));
        assert_eq!(ht.logical(), 7);
        assert_eq!(ht.physical_micros(), 1_700_000_000_000_000);
    }

    #[test]
    fn parse_errors_say_what() {
        let e = "12a".parse::<HybridTime>().unwrap_err();
        assert!(e.to_string().contains("decimal"), "{e}");
        let e = "99999999999999999999999".parse::<HybridTime>().unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        assert!("".parse::<HybridTime>().is_err());
        assert!("-1".parse::<HybridTime>().is_err());
    }

    #[test]
    fn serde_accepts_string_and_integer() {
        let a: HybridTime = serde_json::from_str("\"42\"").unwrap();
        let b: HybridTime = serde_json::from_str("42").unwrap();
        assert_eq!(a, b);
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"42\"");
        assert!(serde_json::from_str::<HybridTime>("-3").is_err());
        assert!(serde_json::from_str::<HybridTime>("1.5").is_err());
    }

    #[test]
    fn clock_is_strictly_increasing_across_threads() {
        let clock = std::sync::Arc::new(HybridClock::starting_after(HybridTime::new(
            u64::MAX >> 13,
            0,
        )));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let c = clock.clone();
                std::thread::spawn(move || (0..10_000).map(|_| c.now()).collect::<Vec<_>>())
            })
            .collect();
        let mut all = Vec::new();
        for h in handles {
            let v = h.join().unwrap();
            assert!(v.windows(2).all(|w| w[0] < w[1]));
            all.extend(v);
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a hybrid time was handed out twice");
    }
}
