//! Sends to owners per forwarded request (issue #48): fencegate's
//! `fencegate_cluster_forward_sends` histogram (one observation per client
//! request a replica sent towards an owner, the value how many times it
//! sent it), read from each cluster replica's admin `/metrics`. A `kill -9`
//! resets a replica's metrics, so the harness reads them right before each
//! kill and once more at the end of the run, and adds the readings up.
//! Requests forwarded between the last reading and a kill are not counted.
//! A fencegate without the metric gives 0 requests.

use std::net::SocketAddr;
use std::time::Duration;

const METRIC: &str = "fencegate_cluster_forward_sends";

/// Forwarded requests and their sends, added over readings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sends {
    /// Client requests sent towards an owner (`_count`).
    pub requests: u64,
    /// Sends to owners in all (`_sum`).
    pub sends: f64,
    /// The most sends any one request took, as the smallest bucket bound
    /// holding every request (`+Inf`: above the last bound); None before a
    /// request.
    pub max: Option<f64>,
    /// Readings that got no answer (their requests are lost).
    pub missed: u32,
}

impl Sends {
    /// The histogram in one `/metrics` text, summed over its label sets.
    pub fn parse(text: &str) -> Sends {
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        let (mut sum, mut count) = (0.0, 0.0);
        for line in text.lines().filter(|l| l.starts_with(METRIC)) {
            let rest = &line[METRIC.len()..];
            let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
                continue;
            };
            if rest.starts_with("_sum") {
                sum += value;
            } else if rest.starts_with("_count") {
                count += value;
            } else if rest.starts_with("_bucket")
                && let Some(le) = label(rest, "le")
            {
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::INFINITY)
                };
                match buckets.iter_mut().find(|(b, _)| *b == le) {
                    Some((_, c)) => *c += value,
                    None => buckets.push((le, value)),
                }
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let max = (count > 0.0)
            .then(|| buckets.iter().find(|(_, c)| *c >= count).map(|(le, _)| *le))
            .flatten();
        Sends {
            requests: count as u64,
            sends: sum,
            max,
            missed: 0,
        }
    }

    /// Adds another reading.
    pub fn add(&mut self, other: Sends) {
        self.requests += other.requests;
        self.sends += other.sends;
        self.max = match (self.max, other.max) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.missed += other.missed;
    }

    /// `sends to owners per forwarded request: mean X, max Y (N requests)`.
    pub fn line(&self) -> String {
        let mean = self.sends / self.requests.max(1) as f64;
        let max = match self.max {
            None => "-".to_string(),
            Some(m) if m.is_infinite() => "above the last bucket".to_string(),
            Some(m) => format!("{m}"),
        };
        let missed = match self.missed {
            0 => String::new(),
            n => format!("; {n} reading(s) of /metrics missed"),
        };
        format!(
            "sends to owners per forwarded request: mean {mean:.2}, max {max} ({} requests){missed}",
            self.requests
        )
    }
}

/// The value of label `name` in `{a="x",name="y"} 1`.
fn label<'a>(series: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let at = series.find(&key)? + key.len();
    let len = series[at..].find('"')?;
    Some(&series[at..at + len])
}

/// One reading of the histogram at a replica's admin address; `missed`
/// set when it did not answer within 2 s.
pub async fn scrape(admin: SocketAddr) -> Sends {
    match get_metrics(admin).await {
        Some(text) => Sends::parse(&text),
        None => Sends {
            missed: 1,
            ..Sends::default()
        },
    }
}

async fn get_metrics(admin: SocketAddr) -> Option<String> {
    use http_body_util::{BodyExt, Full};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<bytes::Bytes>>();
    let req = http::Request::get(format!("http://{admin}/metrics"))
        .body(Full::new(bytes::Bytes::new()))
        .ok()?;
    let limit = Duration::from_secs(2);
    let resp = tokio::time::timeout(limit, client.request(req))
        .await
        .ok()?
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let body = tokio::time::timeout(limit, resp.into_body().collect())
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&body.to_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::Sends;

    #[test]
    fn parses_and_adds() {
        let text = "# TYPE fencegate_cluster_forward_sends histogram\n\
            fencegate_cluster_forward_sends_bucket{le=\"1\"} 8\n\
            fencegate_cluster_forward_sends_bucket{le=\"2\"} 9\n\
            fencegate_cluster_forward_sends_bucket{le=\"3\"} 10\n\
            fencegate_cluster_forward_sends_bucket{le=\"+Inf\"} 10\n\
            fencegate_cluster_forward_sends_sum 13\n\
            fencegate_cluster_forward_sends_count 10\n";
        let mut s = Sends::parse(text);
        assert_eq!((s.requests, s.sends, s.max), (10, 13.0, Some(3.0)));
        s.add(Sends::parse("other_metric 1\n"));
        assert_eq!((s.requests, s.max), (10, Some(3.0)));
        assert!(s.line().contains("mean 1.30, max 3 (10 requests)"));
        assert!(Sends::parse("").line().contains("max - (0 requests)"));
    }
}
