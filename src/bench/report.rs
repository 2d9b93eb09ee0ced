//! What one load run measured: counts, throughput and a latency histogram,
//! printed as one human line and one JSON line (the line `scripts/bench`
//! collects in docs/bench-results.jsonl).

use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::time::Duration;

/// One worker's tally; workers' tallies are merged at the end.
pub struct Tally {
    /// Latency of each successful request, in microseconds.
    pub latency: Histogram<u64>,
    pub ok: u64,
    /// Error answers by HTTP status.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests that got no HTTP answer (connection refused, reset...).
    pub transport_errors: u64,
    pub first_error: Option<String>,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            // 1 µs to 1 hour at 3 significant digits.
            latency: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds"),
            ok: 0,
            statuses: BTreeMap::new(),
            transport_errors: 0,
            first_error: None,
        }
    }
}

impl Tally {
    pub fn record_ok(&mut self, took: Duration) {
        self.ok += 1;
        self.latency.saturating_record(took.as_micros() as u64);
    }

    pub fn record_status(&mut self, status: u16, detail: impl FnOnce() -> String) {
        *self.statuses.entry(status).or_default() += 1;
        self.first_error.get_or_insert_with(detail);
    }

    pub fn record_transport(&mut self, e: String) {
        self.transport_errors += 1;
        self.first_error.get_or_insert(e);
    }

    pub fn merge(&mut self, other: Tally) {
        self.latency
            .add(&other.latency)
            .expect("same histogram bounds");
        self.ok += other.ok;
        for (s, n) in other.statuses {
            *self.statuses.entry(s).or_default() += n;
        }
        self.transport_errors += other.transport_errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// The run's parameters and its merged tally.
pub struct Report {
    pub op: &'static str,
    pub size: u64,
    pub concurrency: usize,
    pub payload: &'static str,
    pub elapsed: Duration,
    pub tally: Tally,
    pub tags: Vec<(String, String)>,
}

impl Report {
    pub fn errors(&self) -> u64 {
        self.tally.statuses.values().sum::<u64>() + self.tally.transport_errors
    }

    pub fn req_per_s(&self) -> f64 {
        self.tally.ok as f64 / self.elapsed.as_secs_f64()
    }

    pub fn mib_per_s(&self) -> f64 {
        self.req_per_s() * self.size as f64 / (1u64 << 20) as f64
    }

    /// Latency at percentile `p` (0-100), in milliseconds.
    pub fn ms(&self, p: f64) -> f64 {
        self.tally.latency.value_at_percentile(p) as f64 / 1000.0
    }

    pub fn json(&self) -> serde_json::Value {
        let statuses: serde_json::Map<String, serde_json::Value> = self
            .tally
            .statuses
            .iter()
            .map(|(s, n)| (s.to_string(), (*n).into()))
            .collect();
        let mut v = serde_json::json!({
            "op": self.op,
            "size": self.size,
            "size_name": super::size_name(self.size),
            "concurrency": self.concurrency,
            "payload": self.payload,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "ok": self.tally.ok,
            "errors": self.errors(),
            "error_statuses": statuses,
            "transport_errors": self.tally.transport_errors,
            "first_error": self.tally.first_error,
            "req_per_s": self.req_per_s(),
            "mib_per_s": self.mib_per_s(),
            "p50_ms": self.ms(50.0),
            "p90_ms": self.ms(90.0),
            "p99_ms": self.ms(99.0),
            "p999_ms": self.ms(99.9),
            "max_ms": self.tally.latency.max() as f64 / 1000.0,
        });
        for (k, val) in &self.tags {
            v[k] = val.clone().into();
        }
        v
    }

    pub fn human(&self) -> String {
        let tags: Vec<String> = self.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut line = format!(
            "{} {} c{} {:.1}s{}{}: {} ok, {} errors; {:.1} req/s, {:.1} MiB/s; \
             p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms",
            self.op,
            super::size_name(self.size),
            self.concurrency,
            self.elapsed.as_secs_f64(),
            if tags.is_empty() { "" } else { " " },
            tags.join(" "),
            self.tally.ok,
            self.errors(),
            self.req_per_s(),
            self.mib_per_s(),
            self.ms(50.0),
            self.ms(90.0),
            self.ms(99.0),
            self.ms(99.9),
        );
        if let Some(e) = &self.tally.first_error {
            line.push_str(&format!(" (first error: {e})"));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_tallies_report_rates_and_percentiles() {
        let mut a = Tally::default();
        for _ in 0..99 {
            a.record_ok(Duration::from_millis(1));
        }
        let mut b = Tally::default();
        b.record_ok(Duration::from_millis(100));
        b.record_status(409, || "409 StaleFencingToken".into());
        a.merge(b);
        let r = Report {
            op: "put",
            size: 1 << 20,
            concurrency: 2,
            payload: "unsigned",
            elapsed: Duration::from_secs(2),
            tally: a,
            tags: vec![("path".into(), "direct".into())],
        };
        assert_eq!(r.errors(), 1);
        assert_eq!(r.req_per_s(), 50.0);
        assert_eq!(r.mib_per_s(), 50.0);
        assert!((r.ms(50.0) - 1.0).abs() < 0.01);
        assert!(r.ms(99.9) > 99.0);
        let j = r.json();
        assert_eq!(j["error_statuses"]["409"], 1);
        assert_eq!(j["path"], "direct");
        assert!(r.human().contains("put 1MiB c2"));
    }
}
