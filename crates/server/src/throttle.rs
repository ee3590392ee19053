//! `--disk-rate MB/s` and `--disk-latency MS` (and `disk_rate`, `disk_latency` in a
//! config file's `[[export]]`): make an export as slow as a disk, for the lab.

use std::time::Duration;

use anyhow::{bail, Result};
use blockwire_blockdev::ThrottleConfig;

/// Parses `--disk-rate`: megabytes (10^6 bytes, as disks are rated) per second,
/// fractions allowed; returns bytes per second.
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let mb: f64 = text
        .trim()
        .trim_end_matches("MB/s")
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a rate in MB/s (e.g. 70 or 70.5)"))?;
    rate_from_mb(mb)
}

/// Parses `--disk-latency`: milliseconds, fractions allowed, zero or more.
pub fn parse_latency(text: &str) -> Result<Duration, String> {
    let ms: f64 = text
        .trim()
        .trim_end_matches("ms")
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a latency in milliseconds (e.g. 5 or 0.5)"))?;
    latency_from_ms(ms)
}

pub fn rate_from_mb(mb: f64) -> Result<u64, String> {
    if !(mb > 0.0 && mb.is_finite()) {
        return Err(format!("the disk rate must be above zero MB/s, not {mb}"));
    }
    Ok(((mb * 1e6) as u64).max(1))
}

pub fn latency_from_ms(ms: f64) -> Result<Duration, String> {
    if !(0.0..=3_600_000.0).contains(&ms) {
        return Err(format!(
            "the disk latency must be between 0 and 3600000 ms, not {ms}"
        ));
    }
    Ok(Duration::from_secs_f64(ms / 1000.0))
}

/// The throttle of a config file's export (`disk_rate` in MB/s, `disk_latency` in
/// ms).
pub fn from_config(
    export: &str,
    rate: Option<f64>,
    latency: Option<f64>,
) -> Result<ThrottleConfig> {
    let rate = match rate.map(rate_from_mb).transpose() {
        Ok(rate) => rate,
        Err(e) => bail!("export '{export}': disk_rate: {e}"),
    };
    let latency = match latency.map(latency_from_ms).transpose() {
        Ok(latency) => latency.unwrap_or_default(),
        Err(e) => bail!("export '{export}': disk_latency: {e}"),
    };
    Ok(ThrottleConfig { rate, latency })
}

/// "70 MB/s, +5 ms per request", for the log.
pub fn describe(config: &ThrottleConfig) -> String {
    let mut parts = Vec::new();
    if let Some(rate) = config.rate {
        parts.push(format!("{} MB/s", rate as f64 / 1e6));
    }
    if !config.latency.is_zero() {
        parts.push(format!(
            "+{} ms per request",
            config.latency.as_secs_f64() * 1000.0
        ));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_decimal_megabytes_per_second() {
        assert_eq!(parse_rate("70"), Ok(70_000_000));
        assert_eq!(parse_rate("0.5 MB/s"), Ok(500_000));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
    }

    #[test]
    fn latencies_are_milliseconds() {
        assert_eq!(parse_latency("5"), Ok(Duration::from_millis(5)));
        assert_eq!(parse_latency("0.25ms"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_latency("0"), Ok(Duration::ZERO));
        assert!(parse_latency("-1").is_err());
    }

    #[test]
    fn config_values_name_the_export() {
        let err = from_config("disk", Some(-3.0), None).unwrap_err();
        assert!(
            err.to_string().starts_with("export 'disk': disk_rate"),
            "{err}"
        );
        let config = from_config("disk", Some(70.0), Some(2.0)).unwrap();
        assert_eq!(describe(&config), "70 MB/s, +2 ms per request");
    }
}
