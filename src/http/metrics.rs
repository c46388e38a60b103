//! Request counters and a latency histogram, written out in the Prometheus
//! text format together with the catalog's totals.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::catalog::CatalogStats;
use crate::store::{HotStats, PutSeconds};

/// Upper bounds of the latency histogram, in seconds.
const BUCKETS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

#[derive(Default)]
pub struct Metrics {
    /// Count by method, then by status.
    requests: Mutex<BTreeMap<&'static str, BTreeMap<u16, u64>>>,
    latency: [AtomicU64; BUCKETS.len() + 1],
    latency_sum_us: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// The method's label: the methods of RFC 9110 and WebDAV's by name, any
/// other as `other`. A client may send any token as a method, and each
/// would otherwise be a counter kept for ever.
fn label(method: &http::Method) -> &'static str {
    const KNOWN: [&str; 16] = [
        "GET",
        "HEAD",
        "PUT",
        "POST",
        "DELETE",
        "OPTIONS",
        "PATCH",
        "TRACE",
        "CONNECT",
        "COPY",
        "MOVE",
        "MKCOL",
        "PROPFIND",
        "PROPPATCH",
        "LOCK",
        "UNLOCK",
    ];
    KNOWN.into_iter().find(|m| *m == method.as_str()).unwrap_or("other")
}

impl Metrics {
    /// Counts one answered request; `elapsed` runs to the response head.
    pub fn record(&self, method: &http::Method, status: u16, elapsed: Duration, bytes_in: u64, bytes_out: u64) {
        *self.requests.lock().entry(label(method)).or_default().entry(status).or_default() += 1;
        let secs = elapsed.as_secs_f64();
        let slot = BUCKETS.iter().position(|b| secs <= *b).unwrap_or(BUCKETS.len());
        self.latency[slot].fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us.fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
    }

    /// The Prometheus exposition text.
    pub fn render(&self, stats: &CatalogStats, engine: &str, put: PutSeconds, hot: HotStats) -> String {
        let mut out = String::new();
        out.push_str("# HELP depot_http_requests_total Requests answered, by method and status.\n");
        out.push_str("# TYPE depot_http_requests_total counter\n");
        for (method, by_status) in self.requests.lock().iter() {
            for (status, n) in by_status {
                let _ = writeln!(out, "depot_http_requests_total{{method=\"{method}\",status=\"{status}\"}} {n}");
            }
        }
        out.push_str("# HELP depot_http_request_duration_seconds Time to the response head.\n");
        out.push_str("# TYPE depot_http_request_duration_seconds histogram\n");
        let mut cumulative = 0;
        for (i, bound) in BUCKETS.iter().enumerate() {
            cumulative += self.latency[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "depot_http_request_duration_seconds_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.latency[BUCKETS.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "depot_http_request_duration_seconds_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = self.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "depot_http_request_duration_seconds_sum {sum}");
        let _ = writeln!(out, "depot_http_request_duration_seconds_count {cumulative}");
        let gauges = [
            (
                "depot_http_received_bytes_total",
                "counter",
                "Request body bytes read.",
                self.bytes_in.load(Ordering::Relaxed) as i64,
            ),
            (
                "depot_http_sent_bytes_total",
                "counter",
                "Response body bytes sent, by declared length.",
                self.bytes_out.load(Ordering::Relaxed) as i64,
            ),
            ("depot_objects", "gauge", "Objects stored.", stats.objects),
            ("depot_logical_bytes", "gauge", "Sum of object sizes.", stats.logical_bytes),
            ("depot_blobs", "gauge", "Distinct blobs stored.", stats.blobs),
            ("depot_blob_bytes", "gauge", "Sum of blob sizes: bytes stored once.", stats.blob_bytes),
            ("depot_hot_hits_total", "counter", "Reads of small objects answered from memory.", hot.hits as i64),
            ("depot_hot_misses_total", "counter", "Reads of small objects that went to the engine.", hot.misses as i64),
            ("depot_hot_bytes", "gauge", "Bytes of small objects kept in memory.", hot.bytes as i64),
            (
                "depot_dedup_saved_bytes",
                "gauge",
                "Bytes not stored thanks to deduplication.",
                (stats.logical_bytes - stats.blob_bytes).max(0),
            ),
        ];
        for (name, kind, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
        let _ = writeln!(
            out,
            "# HELP depot_put_seconds_total Upload time of single PUTs by phase: streaming bytes into the engine, registering in the catalog.\n\
             # TYPE depot_put_seconds_total counter\n\
             depot_put_seconds_total{{phase=\"bytes\"}} {}\ndepot_put_seconds_total{{phase=\"catalog\"}} {}",
            put.bytes, put.catalog
        );
        let _ = writeln!(
            out,
            "# HELP depot_engine_info The blob engine in use.\n# TYPE depot_engine_info gauge\ndepot_engine_info{{engine=\"{engine}\"}} 1"
        );
        out
    }
}
