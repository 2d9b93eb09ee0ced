//! The checker: reads the final log objects against the history and lists
//! every outcome a correctly fenced store cannot produce.
//!
//! A writer appends to a log by read-modify-write, and stops its lock
//! session at the first request that is not `ok`. So an entry can only be in
//! a log if the write that appended it landed (a later write copies it only
//! after reading it). What landed is everything in a final log plus
//! everything some read observed. Per resource, the checker reports:
//!
//! - `token-order`: a log whose tokens go down (a lower-token holder wrote
//!   after reading a higher-token holder's entries);
//! - `lost-update`: an acknowledged append missing from the final log (a
//!   stale holder overwrote it);
//! - `stale-write`: an entry that landed although its write was sent after
//!   a request with a higher token on the same resource had been
//!   acknowledged (the fence had been raised before the write started);
//! - `refused-landed`: a write answered as refused whose entry landed;
//! - `corrupt`, `unknown-entry`, `duplicate`: a log that no sequence of
//!   whole writes could produce.
//!
//! Indeterminate writes may or may not have landed: they are judged only by
//! `stale-write`, like every write that landed.

use super::history::{Entry, Kind, Op, Outcome};
use std::collections::{BTreeMap, HashMap, HashSet};

#[derive(Debug, Clone)]
pub struct Violation {
    pub kind: &'static str,
    pub resource: String,
    pub detail: String,
}

/// `finals`: key -> the final log (or why it could not be parsed).
/// `seen`: every entry some read observed. `corrupt_reads`: reads that
/// returned an unparsable log.
pub fn check(
    ops: &[Op],
    finals: &BTreeMap<String, Result<Vec<Entry>, String>>,
    seen: &HashSet<u64>,
    corrupt_reads: &[String],
) -> Vec<Violation> {
    let mut out = Vec::new();
    let writes: HashMap<u64, &Op> = ops
        .iter()
        .filter(|o| o.kind == Kind::Write)
        .map(|o| (o.id, o))
        .collect();
    let resource_of: HashMap<&str, &str> = ops
        .iter()
        .map(|o| (o.key.as_str(), o.resource.as_str()))
        .collect();
    let res = |key: &str| resource_of.get(key).copied().unwrap_or("?").to_string();

    for c in corrupt_reads {
        out.push(Violation {
            kind: "corrupt",
            resource: "?".into(),
            detail: format!("a read returned {c}"),
        });
    }

    let (landed, in_final) = check_final_logs(finals, &writes, seen, res, &mut out);
    check_outcomes(&writes, &in_final, &landed, &mut out);
    check_stale_writes(ops, &writes, &landed, &mut out);
    out
}

/// Checks each final log (`corrupt`, `duplicate`, `unknown-entry`,
/// `token-order`) and gives what landed (every final entry, every entry
/// in `seen`) and each key's final entries.
fn check_final_logs<'a>(
    finals: &'a BTreeMap<String, Result<Vec<Entry>, String>>,
    writes: &HashMap<u64, &Op>,
    seen: &HashSet<u64>,
    res: impl Fn(&str) -> String,
    out: &mut Vec<Violation>,
) -> (HashSet<u64>, HashMap<&'a str, HashSet<u64>>) {
    // What landed: every final entry, every entry a read saw.
    let mut landed: HashSet<u64> = seen.clone();
    let mut in_final: HashMap<&str, HashSet<u64>> = HashMap::new();
    for (key, log) in finals {
        let log = match log {
            Ok(l) => l,
            Err(e) => {
                out.push(Violation {
                    kind: "corrupt",
                    resource: res(key),
                    detail: format!("final {key}: {e}"),
                });
                continue;
            }
        };
        let set = in_final.entry(key.as_str()).or_default();
        let mut prev: Option<&Entry> = None;
        for e in log {
            landed.insert(e.id);
            if !set.insert(e.id) {
                out.push(Violation {
                    kind: "duplicate",
                    resource: res(key),
                    detail: format!("{key}: entry {} appears twice", e.id),
                });
            }
            match writes.get(&e.id) {
                Some(w) if w.key == *key && w.token == e.token && w.writer == e.writer => {}
                _ => out.push(Violation {
                    kind: "unknown-entry",
                    resource: res(key),
                    detail: format!("{key}: entry {e:?} matches no write to this key"),
                }),
            }
            if let Some(p) = prev
                && e.token < p.token
            {
                out.push(Violation {
                    kind: "token-order",
                    resource: res(key),
                    detail: format!(
                        "{key}: entry {} (writer {}, token {}) follows entry {} (writer {}, token {})",
                        e.id, e.writer, e.token, p.id, p.writer, p.token
                    ),
                });
            }
            prev = Some(e);
        }
    }
    (landed, in_final)
}

/// Checks each write against its answer: an acknowledged one missing
/// from its final log (`lost-update`), a refused one that landed
/// (`refused-landed`).
fn check_outcomes(
    writes: &HashMap<u64, &Op>,
    in_final: &HashMap<&str, HashSet<u64>>,
    landed: &HashSet<u64>,
    out: &mut Vec<Violation>,
) {
    for w in writes.values() {
        match &w.outcome {
            Outcome::Ok => {
                let present = in_final
                    .get(w.key.as_str())
                    .is_some_and(|s| s.contains(&w.id));
                if !present {
                    out.push(Violation {
                        kind: "lost-update",
                        resource: w.resource.clone(),
                        detail: format!(
                            "{}: acknowledged entry {} (writer {}, token {}, acked at {} us) is not in the final log",
                            w.key, w.id, w.writer, w.token, w.end_us
                        ),
                    });
                }
            }
            Outcome::Refused(why) if landed.contains(&w.id) => out.push(Violation {
                kind: "refused-landed",
                resource: w.resource.clone(),
                detail: format!(
                    "{}: entry {} (token {}) was refused ({why}) yet landed",
                    w.key, w.id, w.token
                ),
            }),
            _ => {}
        }
    }
}

/// Checks each write that landed against the highest token acknowledged
/// on its resource before it was sent (`stale-write`).
fn check_stale_writes(
    ops: &[Op],
    writes: &HashMap<u64, &Op>,
    landed: &HashSet<u64>,
    out: &mut Vec<Violation>,
) {
    // Per resource: acknowledged requests by answer time, with the running
    // highest token, to find the highest acknowledged before a write began.
    let mut acked: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for o in ops.iter().filter(|o| o.outcome == Outcome::Ok) {
        acked
            .entry(o.resource.as_str())
            .or_default()
            .push((o.end_us, o.token));
    }
    for v in acked.values_mut() {
        v.sort_unstable();
        let mut max = 0;
        for (_, t) in v.iter_mut() {
            max = max.max(*t);
            *t = max;
        }
    }
    let mut stale: Vec<&&Op> = writes.values().filter(|w| landed.contains(&w.id)).collect();
    stale.sort_by_key(|w| w.id);
    for w in stale {
        let Some(v) = acked.get(w.resource.as_str()) else {
            continue;
        };
        let n = v.partition_point(|(end, _)| *end < w.start_us);
        if n > 0 && v[n - 1].1 > w.token {
            out.push(Violation {
                kind: "stale-write",
                resource: w.resource.clone(),
                detail: format!(
                    "{}: entry {} (writer {}, token {}, {:?}) landed; sent at {} us, after token {} was acknowledged",
                    w.key, w.id, w.writer, w.token, w.outcome, w.start_us, v[n - 1].1
                ),
            });
        }
    }
}

/// `kind=count` pairs, for the report.
pub fn by_kind(v: &[Violation]) -> String {
    let mut m: BTreeMap<&str, usize> = BTreeMap::new();
    for x in v {
        *m.entry(x.kind).or_default() += 1;
    }
    m.iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: u64, kind: Kind, token: u64, start: u64, end: u64, outcome: Outcome) -> Op {
        Op {
            id,
            writer: token as u32,
            session: token,
            resource: "r".into(),
            key: "k".into(),
            token,
            kind,
            start_us: start,
            end_us: end,
            outcome,
            log_len: None,
            new_entries: vec![],
        }
    }

    fn entry(id: u64, token: u64) -> Entry {
        Entry {
            id,
            writer: token as u32,
            token,
        }
    }

    fn finals(log: Vec<Entry>) -> BTreeMap<String, Result<Vec<Entry>, String>> {
        BTreeMap::from([("k".to_string(), Ok(log))])
    }

    #[test]
    fn a_fenced_history_passes() {
        // 5 reads, appends 1; 7 reads (fencing 5), appends 2; 5's late write refused.
        let ops = vec![
            op(10, Kind::Read, 5, 0, 1, Outcome::Ok),
            op(1, Kind::Write, 5, 2, 3, Outcome::Ok),
            op(11, Kind::Read, 7, 4, 5, Outcome::Ok),
            op(2, Kind::Write, 7, 6, 7, Outcome::Ok),
            op(3, Kind::Write, 5, 8, 9, Outcome::Refused("409".into())),
            op(
                4,
                Kind::Write,
                7,
                10,
                11,
                Outcome::Indeterminate("reset".into()),
            ),
        ];
        let v = check(
            &ops,
            &finals(vec![entry(1, 5), entry(2, 7)]),
            &HashSet::new(),
            &[],
        );
        assert!(v.is_empty(), "{v:?}");
    }

    #[test]
    fn an_unfenced_overwrite_is_caught() {
        // 5 read before 7, stalled, and overwrote 7's acknowledged append.
        let ops = vec![
            op(10, Kind::Read, 5, 0, 1, Outcome::Ok),
            op(11, Kind::Read, 7, 4, 5, Outcome::Ok),
            op(2, Kind::Write, 7, 6, 7, Outcome::Ok),
            op(3, Kind::Write, 5, 8, 9, Outcome::Ok),
        ];
        let v = check(&ops, &finals(vec![entry(3, 5)]), &HashSet::new(), &[]);
        assert_eq!(by_kind(&v), "lost-update=1 stale-write=1", "{v:?}");
        // Appending after reading the newer entries breaks the token order.
        let v = check(
            &ops,
            &finals(vec![entry(2, 7), entry(3, 5)]),
            &HashSet::new(),
            &[],
        );
        assert_eq!(by_kind(&v), "stale-write=1 token-order=1", "{v:?}");
    }

    #[test]
    fn refused_entries_seen_by_a_read_count_as_landed() {
        let ops = vec![op(3, Kind::Write, 5, 8, 9, Outcome::Refused("409".into()))];
        let v = check(&ops, &finals(vec![]), &HashSet::from([3]), &[]);
        assert_eq!(by_kind(&v), "refused-landed=1");
    }
}
