//! A project's history setting as a user writes it, `SIZE/TTL` (`100/120s`; `0/0s` or
//! `off` = no history), and [`HistoryCell`], the atomic copy the data plane reads.
//!
//! Invariants: a parsed [`HistorySpec`] is either off (both zero) or has
//! `1 <= size <= MAX_SIZE` and `1 <= ttl_s <= MAX_TTL_S`; `Display` gives the canonical
//! text (`"off"` when off), which is what the stores keep, so a stored value always
//! parses again. The cell packs both numbers in one `AtomicU64`, so a reader never sees
//! the size of one setting with the TTL of another.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The bits of [`HistorySpec::generation`] the cell keeps.
const GENERATION_MASK: u32 = 0xFF_FFFF;

/// Most messages kept per channel.
pub(crate) const MAX_SIZE: u32 = 100_000;
/// Longest time a message is kept, seconds (7 days).
pub(crate) const MAX_TTL_S: u32 = 7 * 24 * 3600;

/// How much of each channel a project keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HistorySpec {
    /// Messages kept per channel; 0 = history off.
    pub size: u32,
    /// Seconds a message is kept at most.
    pub ttl_s: u32,
    /// Which period of history being on this is: [`HistoryCell`] adds one each time
    /// history is turned off (24 bits, wrapping), so logs kept from before are not
    /// taken for current ones after it is turned on again (the messages published
    /// while it was off are in none of them). Always 0 from [`HistorySpec::parse`].
    pub generation: u32,
}

/// Why a history setting was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HistorySpecError {
    #[error("history {0:?} is not of the form SIZE/TTLs (e.g. 100/120s), 0/0s or off")]
    Format(String),
    #[error("history {0:?}: SIZE must be 1 to {MAX_SIZE} and TTL 1 to {MAX_TTL_S} seconds (0/0s turns history off)")]
    Range(String),
}

impl HistorySpec {
    pub const OFF: HistorySpec = HistorySpec {
        size: 0,
        ttl_s: 0,
        generation: 0,
    };

    pub fn is_on(self) -> bool {
        self.size > 0
    }

    /// Parse `"100/120s"`, `"0/0s"` or `"off"` (surrounding whitespace ignored).
    pub fn parse(s: &str) -> Result<HistorySpec, HistorySpecError> {
        let text = s.trim();
        if text == "off" {
            return Ok(HistorySpec::OFF);
        }
        let format = || HistorySpecError::Format(s.to_string());
        let (size, ttl) = text.split_once('/').ok_or_else(format)?;
        let ttl = ttl.strip_suffix('s').ok_or_else(format)?;
        let number = |t: &str| -> Result<u32, HistorySpecError> {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format());
            }
            t.parse::<u32>()
                .map_err(|_| HistorySpecError::Range(s.to_string()))
        };
        let (size, ttl_s) = (number(size)?, number(ttl)?);
        if size == 0 && ttl_s == 0 {
            return Ok(HistorySpec::OFF);
        }
        if !(1..=MAX_SIZE).contains(&size) || !(1..=MAX_TTL_S).contains(&ttl_s) {
            return Err(HistorySpecError::Range(s.to_string()));
        }
        Ok(HistorySpec {
            size,
            ttl_s,
            generation: 0,
        })
    }

    // TTL in bits 0..20, size in 20..40 (both below 2^20), generation in 40..64.
    fn pack(self) -> u64 {
        (u64::from(self.generation & GENERATION_MASK) << 40)
            | (u64::from(self.size) << 20)
            | u64::from(self.ttl_s)
    }

    fn unpack(v: u64) -> HistorySpec {
        HistorySpec {
            size: ((v >> 20) & 0xF_FFFF) as u32,
            ttl_s: (v & 0xF_FFFF) as u32,
            generation: (v >> 40) as u32,
        }
    }
}

impl fmt::Display for HistorySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_on() {
            write!(f, "{}/{}s", self.size, self.ttl_s)
        } else {
            f.write_str("off")
        }
    }
}

/// A project's history setting, shared by every worker and changed in place when the
/// store changes (a running server applies `project set-history` within a second).
#[derive(Debug, Default)]
pub struct HistoryCell(AtomicU64);

impl HistoryCell {
    pub fn new(spec: HistorySpec) -> HistoryCell {
        HistoryCell(AtomicU64::new(spec.pack()))
    }

    /// One relaxed load: what a publish of a project without history pays.
    pub fn get(&self) -> HistorySpec {
        HistorySpec::unpack(self.0.load(Ordering::Relaxed))
    }

    /// Apply a setting (its generation is ignored): turning history off starts a new
    /// generation, which the next period of history on keeps.
    pub fn set(&self, spec: HistorySpec) {
        // The closure always returns Some: the update cannot fail.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                let old = HistorySpec::unpack(v);
                let turned_off = old.is_on() && !spec.is_on();
                let generation =
                    old.generation.wrapping_add(u32::from(turned_off)) & GENERATION_MASK;
                Some(HistorySpec { generation, ..spec }.pack())
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays_canonically() {
        for (input, size, ttl_s, shown) in [
            ("100/120s", 100, 120, "100/120s"),
            (" 007/5s\n", 7, 5, "7/5s"),
            ("0/0s", 0, 0, "off"),
            ("off", 0, 0, "off"),
            ("100000/604800s", 100_000, 604_800, "100000/604800s"),
        ] {
            let spec = HistorySpec::parse(input).unwrap();
            assert_eq!(
                spec,
                HistorySpec {
                    size,
                    ttl_s,
                    generation: 0
                },
                "{input:?}"
            );
            assert_eq!(spec.to_string(), shown);
            assert_eq!(HistorySpec::parse(&spec.to_string()).unwrap(), spec);
        }
    }

    #[test]
    fn rejects_bad_inputs() {
        for bad in [
            "", "100", "100/120", "100/s", "/5s", "a/5s", "-1/5s", "1/2m", "+1/5s",
        ] {
            assert!(
                matches!(HistorySpec::parse(bad), Err(HistorySpecError::Format(_))),
                "{bad:?}"
            );
        }
        for bad in ["0/5s", "5/0s", "100001/5s", "5/604801s", "99999999999/5s"] {
            assert!(
                matches!(HistorySpec::parse(bad), Err(HistorySpecError::Range(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_cell_round_trips() {
        let cell = HistoryCell::new(HistorySpec::OFF);
        assert!(!cell.get().is_on());
        let spec = HistorySpec::parse("10/60s").unwrap();
        cell.set(spec);
        assert_eq!(cell.get(), spec);
        // Off, then on again: a new generation; changing the setting keeps it.
        cell.set(HistorySpec::OFF);
        cell.set(spec);
        assert_eq!(cell.get().generation, 1);
        let other = HistorySpec::parse("100000/604800s").unwrap();
        cell.set(other);
        assert_eq!((cell.get().size, cell.get().ttl_s), (100_000, 604_800));
        assert_eq!(cell.get().generation, 1);
    }
}
