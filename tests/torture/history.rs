//! The history of a torture run: one record per request a writer made (what,
//! with which token, when, and how it ended), plus the faults the nemesis
//! injected. The checker judges the final objects against it, and it is
//! written out as JSON lines so that a failing run can be read afterwards.

use serde::Serialize;
use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Read,
    Write,
}

/// How a request ended, as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "outcome", content = "detail")]
pub enum Outcome {
    /// A 2xx answer (or 404 for a read of a log not written yet).
    Ok,
    /// An answer that promises no effect: 409 StaleFencingToken, any 428,
    /// 503 SlowDown and 503 ServiceUnavailable (`workload::classify`).
    Refused(String),
    /// No answer, or one that does not say whether the write happened
    /// (connection reset, timeout, 502 BadGateway...).
    Indeterminate(String),
}

/// One request.
#[derive(Clone, Debug, Serialize)]
pub struct Op {
    /// Unique in the run. For a write it is also the id of the log entry
    /// the write appends.
    pub id: u64,
    pub writer: u32,
    /// The lock session (one lock acquisition) the request belongs to.
    pub session: u64,
    /// The lock name, which is also the fence resource.
    pub resource: String,
    pub key: String,
    pub token: u64,
    pub kind: Kind,
    /// Microseconds since the run started: sent, and answered.
    pub start_us: u64,
    pub end_us: u64,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Reads: how many entries the log held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_len: Option<usize>,
    /// Reads: entries this read was the first to see. Every entry ever
    /// observed is in some read's list, so the file alone tells which
    /// writes landed at some point.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub new_entries: Vec<u64>,
}

/// A fault the nemesis injected (or a writer inflicted on itself).
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    pub at_us: u64,
    pub event: String,
}

/// The records of one arm.
pub struct History {
    start: Instant,
    next_id: AtomicU64,
    next_session: AtomicU64,
    ops: Mutex<Vec<Op>>,
    events: Mutex<Vec<Event>>,
    seen: Mutex<HashSet<u64>>,
}

impl History {
    pub fn new(start: Instant) -> History {
        History {
            start,
            next_id: AtomicU64::new(1),
            next_session: AtomicU64::new(1),
            ops: Mutex::default(),
            events: Mutex::default(),
            seen: Mutex::default(),
        }
    }

    pub fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn next_session(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    /// Entries of a log just read that no read saw before (and marks them seen).
    pub fn first_seen(&self, entries: &[u64]) -> Vec<u64> {
        let mut seen = self.seen.lock().unwrap();
        entries
            .iter()
            .copied()
            .filter(|e| seen.insert(*e))
            .collect()
    }

    pub fn record(&self, op: Op) {
        self.ops.lock().unwrap().push(op);
    }

    pub fn event(&self, event: String) {
        let at_us = self.now_us();
        self.events.lock().unwrap().push(Event { at_us, event });
    }

    pub fn op_count(&self) -> usize {
        self.ops.lock().unwrap().len()
    }

    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// Every entry some read observed.
    pub fn seen(&self) -> HashSet<u64> {
        self.seen.lock().unwrap().clone()
    }

    /// Writes the ops and events, in time order, one JSON object a line.
    pub fn write_jsonl(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut ops = self.ops();
        ops.sort_by_key(|o| (o.start_us, o.id));
        let events = self.events();
        let mut lines: Vec<(u64, String)> = ops
            .iter()
            .map(|o| (o.start_us, serde_json::to_string(o).unwrap()))
            .chain(
                events
                    .iter()
                    .map(|e| (e.at_us, serde_json::to_string(e).unwrap())),
            )
            .collect();
        lines.sort_by_key(|(t, _)| *t);
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        for (_, l) in lines {
            writeln!(f, "{l}")?;
        }
        f.flush()
    }
}

/// Counts for the summary line.
#[derive(Default, Debug, Clone, Copy)]
pub struct Counts {
    pub ops: usize,
    pub ok: usize,
    pub refused: usize,
    /// Of `refused`, the 503s: the service unavailable, not a stale token.
    pub unavailable: usize,
    pub indeterminate: usize,
}

impl Counts {
    /// The share of requests answered other than `503` or not at all (a
    /// refused stale token is an answer): what the service made available.
    pub fn available(&self) -> f64 {
        let failed = self.unavailable + self.indeterminate;
        1.0 - failed as f64 / self.ops.max(1) as f64
    }
}

pub fn counts(ops: &[Op]) -> Counts {
    let mut c = Counts {
        ops: ops.len(),
        ..Counts::default()
    };
    for o in ops {
        match o.outcome {
            Outcome::Ok => c.ok += 1,
            Outcome::Refused(ref d) => {
                c.refused += 1;
                c.unavailable += usize::from(d.starts_with("503"));
            }
            Outcome::Indeterminate(_) => c.indeterminate += 1,
        }
    }
    c
}

/// One line of a log object: `<entry id> <writer> <token>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub id: u64,
    pub writer: u32,
    pub token: u64,
}

impl Entry {
    pub fn line(&self) -> String {
        format!("{} {} {}\n", self.id, self.writer, self.token)
    }
}

/// Parses a log object. A line that does not parse is an error: nothing a
/// writer sends could produce one, so it means a torn or mixed write.
pub fn parse_log(text: &str) -> Result<Vec<Entry>, String> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut it = l.split(' ').map(str::parse::<u64>);
            match (it.next(), it.next(), it.next(), it.next()) {
                (Some(Ok(id)), Some(Ok(w)), Some(Ok(token)), None) => Ok(Entry {
                    id,
                    writer: w as u32,
                    token,
                }),
                _ => Err(format!("unparsable log line {l:?}")),
            }
        })
        .collect()
}
