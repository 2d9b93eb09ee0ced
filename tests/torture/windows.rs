//! Requests completed per 10 s for each arm, beside the faults that began
//! in that window (issue #48), so that a stall shows: a share of requests
//! answered hides an arm that has almost stopped. From the histories: a
//! request counts in the window its answer came in. Then, per arm, the
//! fewest successful requests in any 30 s window (a step of 10 s), and the
//! cluster arm's successful requests against the single arm's, over the
//! run and in its worst 30 s window.

use super::history::{Event, Op, Outcome};
use std::fmt::Write;

const WINDOW_US: u64 = 10_000_000;
/// 30 s windows, in 10 s steps.
const SPAN: usize = 3;

/// One arm's requests per window: (ok, all).
struct Series {
    arm: String,
    per: Vec<(u64, u64)>,
}

impl Series {
    fn new(arm: &str, ops: &[Op], n: usize) -> Series {
        let mut per = vec![(0, 0); n];
        for o in ops {
            let w = ((o.end_us / WINDOW_US) as usize).min(n - 1);
            per[w].1 += 1;
            per[w].0 += u64::from(o.outcome == Outcome::Ok);
        }
        Series {
            arm: arm.to_string(),
            per,
        }
    }

    /// Successful requests in the 30 s window starting at window `w`.
    fn ok_span(&self, w: usize) -> u64 {
        self.per[w..w + SPAN].iter().map(|p| p.0).sum()
    }

    fn ok(&self) -> u64 {
        self.per.iter().map(|p| p.0).sum()
    }
}

/// A nemesis event, short: `kill9 r1`, `pause r0 1.2s`, `cut r2 etcd+peers
/// 5.0s`. None for the writers' own (stalls, session losses, retries).
fn short(event: &str) -> Option<String> {
    let w: Vec<&str> = event.split_whitespace().collect();
    let ms = |s: &str| format!("{:.1}s", s.parse::<f64>().unwrap_or(0.0) / 1000.0);
    let from = |e: &str| match (e.contains("etcd"), e.contains("peers")) {
        (true, true) => "etcd+peers",
        (true, false) => "etcd",
        _ => "peers",
    };
    match w.as_slice() {
        ["kill9", "replica", r, ..] => Some(format!("kill9 r{r}")),
        ["pause", "replica", r, "for", t, ..] => Some(format!("pause r{r} {}", ms(t))),
        ["cut", "replica", r, ..] => {
            let t = w.iter().rev().nth(1).copied().unwrap_or("0");
            Some(format!("cut r{r} {} {}", from(event), ms(t)))
        }
        _ => None,
    }
}

/// The table and the 30 s figures. `arms`: each arm's name and requests;
/// `events`: the faults and the writers' retries of a 503 (the cluster
/// arm's history: it has every fault; `cluster 503s` counts its retries).
pub fn report(arms: &[(String, Vec<Op>)], events: &[Event]) -> String {
    let end_us = arms
        .iter()
        .flat_map(|(_, ops)| ops.iter().map(|o| o.end_us))
        .max()
        .unwrap_or(0);
    let n = (end_us / WINDOW_US + 1) as usize;
    let series: Vec<Series> = arms.iter().map(|(a, o)| Series::new(a, o, n)).collect();
    let mut out =
        String::from("requests completed per 10 s, ok/all, and the faults that began then\n");
    let _ = write!(out, "{:>6}", "t(s)");
    for s in &series {
        let _ = write!(out, " {:>13}", s.arm);
    }
    let _ = writeln!(out, " {:>13}  faults", "cluster 503s");
    for w in 0..n {
        let _ = write!(out, "{:>6}", w as u64 * WINDOW_US / 1_000_000);
        for s in &series {
            let _ = write!(out, " {:>13}", format!("{}/{}", s.per[w].0, s.per[w].1));
        }
        let at = |e: &Event| (e.at_us / WINDOW_US) as usize == w;
        let retries = events
            .iter()
            .filter(|e| at(e) && e.event.starts_with("retry-503"))
            .count();
        let faults: Vec<String> = events
            .iter()
            .filter(|e| at(e))
            .filter_map(|e| short(&e.event))
            .collect();
        let line = format!(" {retries:>13}  {}", faults.join("; "));
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out += &spans(&series, (end_us / WINDOW_US) as usize);
    out
}

/// The fewest successful requests per arm in a whole 30 s window (of the
/// `full` whole 10 s windows), and the cluster against the single arm.
fn spans(series: &[Series], full: usize) -> String {
    let mut out = String::new();
    if full < SPAN {
        return "no whole 30 s window in the run\n".into();
    }
    let starts = 0..=full - SPAN;
    let fewest: Vec<String> = series
        .iter()
        .map(|s| {
            let w = starts.clone().min_by_key(|&w| s.ok_span(w)).unwrap();
            format!("{} {} (t={} s)", s.arm, s.ok_span(w), w * 10)
        })
        .collect();
    let _ = writeln!(
        out,
        "fewest ok requests in a 30 s window (10 s steps): {}",
        fewest.join(", ")
    );
    let find = |name: &str| series.iter().find(|s| s.arm == name);
    if let (Some(c), Some(s)) = (find("cluster"), find("single")) {
        let ratio = |a: u64, b: u64| a as f64 / b.max(1) as f64;
        let worst = starts
            .min_by(|&a, &b| {
                ratio(c.ok_span(a), s.ok_span(a)).total_cmp(&ratio(c.ok_span(b), s.ok_span(b)))
            })
            .unwrap();
        let (cw, sw) = (c.ok_span(worst), s.ok_span(worst));
        let _ = writeln!(
            out,
            "cluster/single ok requests: run {:.2}x ({}/{}), worst 30 s window {:.2}x (t={}-{} s: {cw}/{sw})",
            ratio(c.ok(), s.ok()),
            c.ok(),
            s.ok(),
            ratio(cw, sw),
            worst * 10,
            worst * 10 + 30
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::history::{Event, Kind, Op, Outcome};
    use super::{report, short};

    fn op(end_s: u64, ok: bool) -> Op {
        Op {
            id: 0,
            writer: 0,
            session: 0,
            resource: String::new(),
            key: String::new(),
            token: 0,
            kind: Kind::Read,
            start_us: 0,
            end_us: end_s * 1_000_000,
            outcome: if ok {
                Outcome::Ok
            } else {
                Outcome::Refused("503 ServiceUnavailable".into())
            },
            log_len: None,
            new_entries: vec![],
        }
    }

    #[test]
    fn stalls_show() {
        // The cluster makes 10 ok a second, none from 20 s to 40 s.
        let cluster = (0..60)
            .filter(|s| !(20..40).contains(s))
            .map(|s| op(s, true));
        let single = (0..60).map(|s| op(s, s != 5));
        let arms = vec![
            ("cluster".to_string(), cluster.collect()),
            ("single".to_string(), single.collect()),
        ];
        let events = vec![Event {
            at_us: 21_000_000,
            event: "kill9 replica 1".into(),
        }];
        let text = report(&arms, &events);
        println!("{text}");
        let row = |t: &str| {
            let row = text
                .lines()
                .find(|l| l.split_whitespace().next() == Some(t));
            row.unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(row("20"), "20 0/0 10/10 0 kill9 r1");
        assert_eq!(row("0"), "0 10/10 9/10 0");
        assert!(text.contains("fewest ok requests in a 30 s window (10 s steps): cluster 10 (t=10 s), single 29 (t=0 s)"));
        assert!(text.contains("run 0.68x (40/59), worst 30 s window 0.33x (t=10-40 s: 10/30)"));
    }

    #[test]
    fn shortens_faults() {
        assert_eq!(short("kill9 replica 1").unwrap(), "kill9 r1");
        assert_eq!(
            short("pause replica 0 for 1200 ms").unwrap(),
            "pause r0 1.2s"
        );
        assert_eq!(
            short("cut replica 2 off from etcd and its peers for 5000 ms").unwrap(),
            "cut r2 etcd+peers 5.0s"
        );
        assert_eq!(
            short("cut replica 2 off from its peers for 3000 ms").unwrap(),
            "cut r2 peers 3.0s"
        );
        assert!(short("retry-503 attempt=1 after_ms=3").is_none());
    }
}
