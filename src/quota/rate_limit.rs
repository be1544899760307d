//! The textual quota a user writes, `N/s` or `N/min`, and its exact round trip.
//!
//! Invariants: a parsed [`RateLimit`] has `1 <= count <= MAX_COUNT`; `Display` gives back
//! the canonical text (`"0100/s"` parses, and prints as `"100/s"`), which is also what the
//! store keeps, so a stored limit always parses again.

use std::fmt;
use std::str::FromStr;

/// Largest accepted count. 10 million per second keeps the emission interval at 100 ns
/// or more, far above the rounding of integer nanoseconds.
pub(crate) const MAX_COUNT: u32 = 10_000_000;

/// The period a [`RateLimit`] counts over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Per {
    Second,
    Minute,
}

impl Per {
    pub fn as_str(self) -> &'static str {
        match self {
            Per::Second => "s",
            Per::Minute => "min",
        }
    }

    pub fn period_ns(self) -> u64 {
        match self {
            Per::Second => 1_000_000_000,
            Per::Minute => 60_000_000_000,
        }
    }
}

/// `count` requests per `per`: the burst size and the sustained rate of a project.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RateLimit {
    pub count: u32,
    pub per: Per,
}

/// Why a rate-limit string was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RateLimitError {
    #[error("rate limit {0:?} is not of the form N/s or N/min")]
    Format(String),
    #[error("rate limit {0:?}: the count must be a whole number from 1 to {MAX_COUNT}")]
    Count(String),
}

impl RateLimit {
    /// Parse `"100/s"` or `"6000/min"` (surrounding whitespace ignored).
    pub fn parse(s: &str) -> Result<RateLimit, RateLimitError> {
        let text = s.trim();
        let (count, unit) = text
            .split_once('/')
            .ok_or_else(|| RateLimitError::Format(s.to_string()))?;
        let per = match unit {
            "s" => Per::Second,
            "min" => Per::Minute,
            _ => return Err(RateLimitError::Format(s.to_string())),
        };
        // Digits only: `u32::from_str` would also take a leading '+'.
        if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(RateLimitError::Count(s.to_string()));
        }
        let count = count
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_COUNT).contains(n))
            .ok_or_else(|| RateLimitError::Count(s.to_string()))?;
        Ok(RateLimit { count, per })
    }

    /// Nanoseconds between two requests at the sustained rate, rounded up so that the
    /// long-run rate never exceeds the limit.
    pub fn emission_interval_ns(self) -> u64 {
        self.per.period_ns().div_ceil(u64::from(self.count.max(1)))
    }

    /// Nanoseconds of debt a full burst represents: `count` emission intervals. With the
    /// interval rounded up this is what makes exactly `count` requests fit in a burst.
    pub fn burst_ns(self) -> u64 {
        self.emission_interval_ns()
            .saturating_mul(u64::from(self.count))
    }

    /// One `u64` holding both fields, so a [`super::Quota`] can swap its limit atomically.
    pub(crate) fn pack(self) -> u64 {
        let per = match self.per {
            Per::Second => 0,
            Per::Minute => 1,
        };
        (u64::from(self.count) << 8) | per
    }

    pub(crate) fn unpack(packed: u64) -> RateLimit {
        let per = if packed & 0xff == 1 {
            Per::Minute
        } else {
            Per::Second
        };
        // Only values made by `pack` are stored, so the count fits in u32 and is >= 1.
        let count = ((packed >> 8) as u32).max(1);
        RateLimit { count, per }
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, self.per.as_str())
    }
}

impl FromStr for RateLimit {
    type Err = RateLimitError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RateLimit::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays_canonically() {
        for (input, count, per, shown) in [
            ("100/s", 100, Per::Second, "100/s"),
            ("6000/min", 6000, Per::Minute, "6000/min"),
            ("1/s", 1, Per::Second, "1/s"),
            ("10000000/s", 10_000_000, Per::Second, "10000000/s"),
            (" 0100/min\n", 100, Per::Minute, "100/min"),
        ] {
            let rl = RateLimit::parse(input).unwrap();
            assert_eq!(rl, RateLimit { count, per }, "{input:?}");
            assert_eq!(rl.to_string(), shown);
            assert_eq!(RateLimit::parse(&rl.to_string()).unwrap(), rl);
        }
    }

    #[test]
    fn rejects_bad_inputs() {
        for bad in [
            "", "100", "/s", "100/", "100/h", "100/sec", "100/S", "100 /s",
        ] {
            assert!(RateLimit::parse(bad).is_err(), "{bad:?} should fail");
        }
        for bad in [
            "0/s",
            "-1/s",
            "+5/s",
            "1.5/s",
            "10000001/s",
            "99999999999999999999/min",
            "ten/s",
        ] {
            assert_eq!(
                RateLimit::parse(bad),
                Err(RateLimitError::Count(bad.to_string())),
                "{bad:?}"
            );
        }
        assert!(matches!(
            RateLimit::parse("5/hour"),
            Err(RateLimitError::Format(_))
        ));
    }

    #[test]
    fn pack_round_trips() {
        for s in ["1/s", "10000000/min", "250/min"] {
            let rl = RateLimit::parse(s).unwrap();
            assert_eq!(RateLimit::unpack(rl.pack()), rl);
        }
    }

    #[test]
    fn emission_interval_rounds_up() {
        assert_eq!(
            RateLimit::parse("3/s").unwrap().emission_interval_ns(),
            333_333_334
        );
        assert_eq!(
            RateLimit::parse("1000/min").unwrap().emission_interval_ns(),
            60_000_000
        );
    }
}
