//! UTC calendar time from Unix seconds, without a date library: the SigV4
//! timestamps (`s3::sigv4`) and the access log's (`access_log`). A leaf.

/// A UTC date and time of day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    pub month: u8,
    pub day: u8,
    pub hour: u8,
    pub minute: u8,
    pub second: u8,
}

/// The UTC date and time of `unix` seconds since 1970 (Howard Hinnant's
/// days-to-civil algorithm).
pub fn civil(unix: u64) -> Civil {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    Civil {
        year: yoe + era * 400 + i64::from(month <= 2),
        month,
        day,
        hour: (secs / 3600) as u8,
        minute: (secs / 60 % 60) as u8,
        second: (secs % 60) as u8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        let c = |y, mo, d, h, mi, s| Civil {
            year: y,
            month: mo,
            day: d,
            hour: h,
            minute: mi,
            second: s,
        };
        assert_eq!(civil(0), c(1970, 1, 1, 0, 0, 0));
        assert_eq!(civil(951_782_400), c(2000, 2, 29, 0, 0, 0));
        assert_eq!(civil(1_795_486_728), c(2026, 11, 24, 2, 18, 48));
        assert_eq!(civil(4_107_542_399), c(2100, 2, 28, 23, 59, 59));
    }
}
