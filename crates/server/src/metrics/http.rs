//! The HTTP endpoint Prometheus scrapes: `GET /metrics`, on a thread of its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{anyhow, Result};
use tiny_http::{Header, Method, Response, Server};

use super::Metrics;

/// The OpenMetrics text format, which prometheus-client writes and Prometheus
/// asks for first.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A running metrics endpoint; [`stop`](Self::stop) ends it.
pub struct MetricsEndpoint {
    server: Arc<Server>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl MetricsEndpoint {
    /// Listens on `addr` and answers scrapes from `metrics`.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<MetricsEndpoint> {
        let server =
            Server::http(addr).map_err(|e| anyhow!("cannot listen for metrics on {addr}: {e}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| anyhow!("the metrics listener has no IP address"))?;
        let server = Arc::new(server);
        let serving = server.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for request in serving.incoming_requests() {
                    let response = answer(request.method(), request.url(), &metrics);
                    if let Err(e) = request.respond(response) {
                        tracing::debug!("metrics: cannot answer a scrape: {e}");
                    }
                }
            })?;
        Ok(MetricsEndpoint {
            server,
            thread: Some(thread),
            addr,
        })
    }

    /// The address actually bound (port 0 included).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops answering and waits for the thread.
    pub fn stop(mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn answer(method: &Method, url: &str, metrics: &Metrics) -> Response<std::io::Cursor<Vec<u8>>> {
    let path = url.split('?').next().unwrap_or(url);
    if path != "/metrics" {
        return Response::from_string("blockwire: metrics are at /metrics\n").with_status_code(404);
    }
    if !matches!(method, Method::Get | Method::Head) {
        return Response::from_string("GET /metrics\n").with_status_code(405);
    }
    match metrics.encode() {
        Ok(text) => {
            let header = Header::from_bytes("Content-Type", CONTENT_TYPE)
                .expect("a constant header is valid");
            Response::from_string(text).with_header(header)
        }
        Err(e) => Response::from_string(format!("{e:#}\n")).with_status_code(500),
    }
}
