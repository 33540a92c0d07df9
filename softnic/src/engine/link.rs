//! The link model: bandwidth and latency per port.
//!
//! A WQE that moves `n` bytes starts when the port's transmitter is free
//! (WQEs of every QP of the port share it, in the order the engine starts
//! them), occupies it for `n / bandwidth`, and completes `latency` later:
//! `due = max(start, tx_free) + n / bandwidth + latency`. Its data lands and
//! its CQE is written no earlier than `due`. Time is whatever clock the
//! caller passes to the engine, so tests run the model in virtual time.

/// Bandwidth and latency of a port. `fs_per_byte == 0` and `latency_ns == 0`
/// (the [`Default`]) disables the model.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LinkModel {
    /// Femtoseconds per byte (8e15 / bits per second): 20 000 at 400 Gb/s.
    pub fs_per_byte: u64,
    /// One-way latency added to every WQE, ns.
    pub latency_ns: u64,
}

impl LinkModel {
    /// No model: WQEs complete when executed.
    pub const OFF: LinkModel = LinkModel {
        fs_per_byte: 0,
        latency_ns: 0,
    };

    /// A link of `bits_per_second` (0: unlimited) and `latency_ns`.
    pub const fn new(bits_per_second: u64, latency_ns: u64) -> LinkModel {
        LinkModel {
            fs_per_byte: match 8_000_000_000_000_000u64.checked_div(bits_per_second) {
                Some(fs) => fs,
                None => 0,
            },
            latency_ns,
        }
    }

    /// Whether the model changes anything.
    pub const fn enabled(&self) -> bool {
        self.fs_per_byte != 0 || self.latency_ns != 0
    }

    /// Time on the wire of `bytes`, ps.
    pub const fn wire_ps(&self, bytes: u64) -> u64 {
        // bytes ≤ 2^31 and fs_per_byte ≤ 8e15 / 1 bit/s would overflow; the
        // parser accepts at least 1 kb/s (8e12 fs/byte): 2^31 × 8e12 < 2^64.
        bytes.saturating_mul(self.fs_per_byte) / 1000
    }

    /// Bandwidth in bits per second (0 when unlimited).
    pub const fn bits_per_second(&self) -> u64 {
        match 8_000_000_000_000_000u64.checked_div(self.fs_per_byte) {
            Some(bps) => bps,
            None => 0,
        }
    }
}

/// Why a link description did not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkParseError {
    /// Not two comma-separated parts.
    Shape,
    /// The bandwidth part is not `<number><unit>` with a known unit.
    Bandwidth,
    /// The latency part is not `<number><unit>` with a known unit.
    Latency,
    /// A bandwidth below 1 kb/s or above 1 Pb/s, or a latency above 10 s.
    Range,
}

impl LinkParseError {
    /// What was wrong, in words.
    pub const fn description(self) -> &'static str {
        match self {
            LinkParseError::Shape => "expected two parts separated by a comma: <bandwidth>,<latency>",
            LinkParseError::Bandwidth => "the bandwidth is not a number followed by bps, kbps, mbps, gbps or tbps",
            LinkParseError::Latency => "the latency is not a number followed by ns, us, ms or s",
            LinkParseError::Range => "the bandwidth must lie in 1kbps..=1000tbps and the latency in 0..=10s",
        }
    }
}

/// The forms [`parse_link`] accepts, for error messages.
pub const LINK_FORMS: &str = "`<bandwidth>,<latency>` such as `400gbps,2us` (bandwidth units bps, kbps, mbps, gbps, tbps; \
latency units ns, us, ms, s; decimals allowed, e.g. `12.5gbps,1.5us`), or `off`";

/// Parses `400gbps,2us` (case-insensitive, spaces around the parts
/// allowed) into a model; `off`, `none` or an empty string give `None`.
pub fn parse_link(s: &str) -> Result<Option<LinkModel>, LinkParseError> {
    let s = s.trim();
    if s.is_empty() || s.eq_ignore_ascii_case("off") || s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let mut parts = s.split(',');
    let (bw, lat) = match (parts.next(), parts.next(), parts.next()) {
        (Some(b), Some(l), None) => (b.trim(), l.trim()),
        _ => return Err(LinkParseError::Shape),
    };
    let bps =
        parse_scaled(bw, &[("tbps", 1e12), ("gbps", 1e9), ("mbps", 1e6), ("kbps", 1e3), ("bps", 1.0)]).ok_or(LinkParseError::Bandwidth)?;
    let ns = parse_scaled(lat, &[("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)]).ok_or(LinkParseError::Latency)?;
    if !(1e3..=1e15).contains(&bps) || !(0.0..=1e10).contains(&ns) {
        return Err(LinkParseError::Range);
    }
    Ok(Some(LinkModel {
        fs_per_byte: (8e15 / bps + 0.5) as u64,
        latency_ns: (ns + 0.5) as u64,
    }))
}

/// `<number><unit>` with the first matching unit (longest units first in
/// `units`), case-insensitive; the number is a plain non-negative decimal.
fn parse_scaled(s: &str, units: &[(&str, f64)]) -> Option<f64> {
    for &(unit, scale) in units {
        if s.len() > unit.len() && s.is_char_boundary(s.len() - unit.len()) {
            let (num, u) = s.split_at(s.len() - unit.len());
            if u.eq_ignore_ascii_case(unit) {
                let num = num.trim_end();
                if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
                    return None;
                }
                return num.parse::<f64>().ok().map(|v| v * scale);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        let m = parse_link("400gbps,2us").unwrap().unwrap();
        assert_eq!(m.fs_per_byte, 20_000);
        assert_eq!(m.latency_ns, 2_000);
        assert_eq!(m.bits_per_second(), 400_000_000_000);
        let m = parse_link(" 12.5GBPS , 1.5us ").unwrap().unwrap();
        assert_eq!(m.fs_per_byte, 640_000);
        assert_eq!(m.latency_ns, 1_500);
        assert_eq!(parse_link("1tbps,0ns").unwrap().unwrap().fs_per_byte, 8_000);
        assert_eq!(parse_link("100mbps,1ms").unwrap().unwrap().latency_ns, 1_000_000);
        assert_eq!(parse_link("off").unwrap(), None);
        assert_eq!(parse_link("").unwrap(), None);
    }

    #[test]
    fn rejects_everything_else() {
        for (s, e) in [
            ("400gbps", LinkParseError::Shape),
            ("400gbps,2us,1", LinkParseError::Shape),
            ("400gb,2us", LinkParseError::Bandwidth),
            ("gbps,2us", LinkParseError::Bandwidth),
            ("-4gbps,2us", LinkParseError::Bandwidth),
            ("4e9bps,2us", LinkParseError::Bandwidth),
            ("400gbps,2", LinkParseError::Latency),
            ("400gbps,2 weeks", LinkParseError::Latency),
            ("1bps,1us", LinkParseError::Range),
            ("400gbps,11s", LinkParseError::Range),
        ] {
            assert_eq!(parse_link(s), Err(e), "{s}");
        }
    }

    #[test]
    fn blocks_reserving_at_once_queue_on_one_transmitter() {
        // Four threads (a port's engine blocks), started together, reserve
        // 7 ps each 100 000 times, all as early as 0: every reservation
        // gets a slot of its own, one after another, none lost or shared.
        use std::sync::atomic::AtomicU64;
        use std::sync::Barrier;
        const EACH: u64 = 100_000;
        let free = AtomicU64::new(0);
        let p = free.as_ptr() as usize;
        let start = Barrier::new(4);
        let mut ends: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let start = &start;
                    s.spawn(move || {
                        start.wait();
                        // SAFETY: `free` outlives the scope; 8-byte aligned.
                        (0..EACH)
                            .map(|_| unsafe { crate::engine::mem::reserve_wire(p as *mut u64, 0, 7) })
                            .collect::<Vec<u64>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        ends.sort_unstable();
        ends.dedup();
        assert_eq!(ends.len() as u64, 4 * EACH, "reservations shared a slot");
        assert_eq!(ends.last(), Some(&(4 * EACH * 7)), "reservations lost");
        assert_eq!(free.into_inner(), 4 * EACH * 7);
        // A reservation never starts before its earliest time, nor before
        // the transmitter is free.
        let mut w = 100u64;
        // SAFETY: a live local.
        assert_eq!(unsafe { crate::engine::mem::reserve_wire(&mut w, 50, 10) }, 110);
        // SAFETY: as above.
        assert_eq!(unsafe { crate::engine::mem::reserve_wire(&mut w, 500, 10) }, 510);
    }

    #[test]
    fn wire_time() {
        let m = LinkModel::new(400_000_000_000, 0);
        assert_eq!(m.wire_ps(1 << 20), 20_971_520);
        assert_eq!(LinkModel::OFF.wire_ps(1 << 20), 0);
        assert!(!LinkModel::OFF.enabled());
    }
}
