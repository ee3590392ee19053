//! A plain HTTP/1.0 GET for tests that read a metrics endpoint or Prometheus's API,
//! so the tests need no HTTP client program.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// `GET path` from `addr` (`HOST:PORT`): the status code and the body.
pub fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    // Prometheus asks for OpenMetrics first; so does this.
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\
         Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// `text` percent-encoded for a URL's query string.
pub fn query_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The samples of a text exposition: `name{labels}` to value, comments skipped.
pub fn samples(exposition: &str) -> Vec<(String, f64)> {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}
