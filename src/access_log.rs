//! The access log: one line per request, formatted by hand into a reused
//! buffer and appended to the same [`LogBuffer`] as every other log line
//! (`main.rs` installs it). Formatting the line through `tracing`'s
//! `fmt` layer, a `Display` call per field, was the single largest item
//! of fencegate's own work per request (docs/benchmarks-log.md, "CPU per request").
//!
//! The line is the one `tracing`'s formatter writes for the same event, in
//! both formats: `human` (`<time>  INFO fencegate::proxy: request
//! request_id=... op="PutObject" ...`) and `json` (`{"timestamp":...,
//! "level":"INFO","fields":{"message":"request",...},"target":
//! "fencegate::proxy"}`), so that nothing reading the logs notices. It is
//! written only when the log filter lets `fencegate::proxy` log at that
//! level. Without an installed writer (fencegate used as a library, the
//! in-process tests) the line goes through `tracing` as an event.
//! It depends on `utc` and `log_buffer` only.

use crate::log_buffer::LogBuffer;
use crate::utc;
use std::cell::RefCell;
use std::io::Write;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What one request's line says.
pub struct Line<'a> {
    pub request_id: &'a str,
    pub method: &'a str,
    pub op: &'a str,
    pub bucket: &'a str,
    pub key: &'a str,
    pub access_key: &'a str,
    /// A session credential's lock (`fencegate lock --credentials...`),
    /// empty for other credentials.
    pub lock: &'a str,
    pub resource: &'a str,
    pub token: Option<u64>,
    pub highest: Option<u64>,
    pub decision: &'a str,
    pub payload: &'a str,
    pub status: u16,
    pub bytes_in: u64,
    pub elapsed: Duration,
    /// Logged at `warn` (a refused stale write), else at `info`.
    pub warn: bool,
}

struct Sink {
    json: bool,
    writer: LogBuffer,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// Sends access lines to `writer` from now on (once per process).
pub fn install(json: bool, writer: LogBuffer) {
    let _ = SINK.set(Sink { json, writer });
}

/// Logs one request.
pub fn write(line: &Line) {
    let enabled = if line.warn {
        tracing::enabled!(target: "fencegate::proxy", tracing::Level::WARN)
    } else {
        tracing::enabled!(target: "fencegate::proxy", tracing::Level::INFO)
    };
    if !enabled {
        return;
    }
    let Some(sink) = SINK.get() else {
        return as_event(line);
    };
    thread_local! {
        static BUF: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(512));
    }
    BUF.with_borrow_mut(|buf| {
        buf.clear();
        if sink.json {
            json(buf, line, SystemTime::now());
        } else {
            human(buf, line, SystemTime::now());
        }
        sink.writer.append(buf);
    });
}

fn as_event(l: &Line) {
    macro_rules! event {
        ($level:ident) => {
            tracing::$level!(
                target: "fencegate::proxy",
                request_id = %l.request_id,
                method = %l.method,
                op = l.op,
                bucket = l.bucket,
                key = l.key,
                access_key = l.access_key,
                lock = l.lock,
                resource = l.resource,
                token = l.token.map(|t| t.to_string()).unwrap_or_default(),
                highest = l.highest.map(|t| t.to_string()).unwrap_or_default(),
                decision = l.decision,
                payload = l.payload,
                status = l.status,
                bytes_in = l.bytes_in,
                duration_ms = l.elapsed.as_secs_f64() * 1000.0,
                "request"
            )
        };
    }
    if l.warn {
        event!(warn);
    } else {
        event!(info);
    }
}

/// A field's value, as the two formats tell them apart.
enum Value<'a> {
    /// `%` in the event: written bare in `human`, quoted in `json`.
    Bare(&'a str),
    /// A string field: quoted and escaped (`{:?}` in `human`, JSON in `json`).
    Str(&'a str),
    /// A token, as a string (empty when there is none).
    Token(Option<u64>),
    Number(u64),
    Millis(Duration),
}

/// The line's fields, in the order `tracing` writes them.
fn fields<'a>(l: &Line<'a>) -> [(&'static str, Value<'a>); 15] {
    use Value::*;
    [
        ("request_id", Bare(l.request_id)),
        ("method", Bare(l.method)),
        ("op", Str(l.op)),
        ("bucket", Str(l.bucket)),
        ("key", Str(l.key)),
        ("access_key", Str(l.access_key)),
        ("lock", Str(l.lock)),
        ("resource", Str(l.resource)),
        ("token", Token(l.token)),
        ("highest", Token(l.highest)),
        ("decision", Str(l.decision)),
        ("payload", Str(l.payload)),
        ("status", Number(l.status.into())),
        ("bytes_in", Number(l.bytes_in)),
        ("duration_ms", Millis(l.elapsed)),
    ]
}

/// `2026-11-24T02:17:48.295637Z  INFO fencegate::proxy: request k=v ...`
fn human(buf: &mut Vec<u8>, l: &Line, now: SystemTime) {
    timestamp(buf, now);
    buf.extend_from_slice(if l.warn { b"  WARN" } else { b"  INFO" });
    buf.extend_from_slice(b" fencegate::proxy: request");
    for (name, value) in fields(l) {
        buf.push(b' ');
        buf.extend_from_slice(name.as_bytes());
        buf.push(b'=');
        match value {
            Value::Bare(v) => buf.extend_from_slice(v.as_bytes()),
            Value::Str(v) => human_str(buf, v),
            Value::Token(t) => quoted_token(buf, t),
            Value::Number(n) => number(buf, n),
            Value::Millis(d) => millis(buf, d),
        }
    }
    buf.push(b'\n');
}

/// `"value"`, quoted and escaped as `{:?}` does.
fn human_str(buf: &mut Vec<u8>, value: &str) {
    if value
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        buf.push(b'"');
        buf.extend_from_slice(value.as_bytes());
        buf.push(b'"');
    } else {
        let _ = write!(buf, "{value:?}");
    }
}

fn quoted_token(buf: &mut Vec<u8>, token: Option<u64>) {
    buf.push(b'"');
    if let Some(t) = token {
        number(buf, t);
    }
    buf.push(b'"');
}

/// `{"timestamp":"...","level":"INFO","fields":{"message":"request",...},
/// "target":"fencegate::proxy"}`
fn json(buf: &mut Vec<u8>, l: &Line, now: SystemTime) {
    buf.extend_from_slice(b"{\"timestamp\":\"");
    timestamp(buf, now);
    buf.extend_from_slice(if l.warn {
        b"\",\"level\":\"WARN\""
    } else {
        b"\",\"level\":\"INFO\""
    });
    buf.extend_from_slice(b",\"fields\":{\"message\":\"request\"");
    for (name, value) in fields(l) {
        buf.extend_from_slice(b",\"");
        buf.extend_from_slice(name.as_bytes());
        buf.extend_from_slice(b"\":");
        match value {
            Value::Bare(v) | Value::Str(v) => {
                let _ = serde_json::to_writer(&mut *buf, v);
            }
            Value::Token(t) => quoted_token(buf, t),
            Value::Number(n) => number(buf, n),
            Value::Millis(d) => millis(buf, d),
        }
    }
    buf.extend_from_slice(b"},\"target\":\"fencegate::proxy\"}\n");
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ`, UTC. The date and time to the second
/// are formatted once per second per thread.
fn timestamp(buf: &mut Vec<u8>, now: SystemTime) {
    thread_local! {
        static LAST: RefCell<(u64, Vec<u8>)> = const { RefCell::new((u64::MAX, Vec::new())) };
    }
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    LAST.with_borrow_mut(|(secs, text)| {
        if *secs != since.as_secs() {
            *secs = since.as_secs();
            text.clear();
            let t = utc::civil(*secs);
            pad(text, t.year as u64, 4);
            text.push(b'-');
            pad(text, t.month.into(), 2);
            text.push(b'-');
            pad(text, t.day.into(), 2);
            text.push(b'T');
            pad(text, t.hour.into(), 2);
            text.push(b':');
            pad(text, t.minute.into(), 2);
            text.push(b':');
            pad(text, t.second.into(), 2);
            text.push(b'.');
        }
        buf.extend_from_slice(text);
    });
    pad(buf, since.subsec_micros().into(), 6);
    buf.push(b'Z');
}

/// Milliseconds with up to six decimals, trailing zeros dropped.
fn millis(buf: &mut Vec<u8>, d: Duration) {
    let nanos = d.as_nanos();
    number(buf, (nanos / 1_000_000) as u64);
    let mut frac = (nanos % 1_000_000) as u64;
    if frac == 0 {
        return;
    }
    let mut digits = 6;
    while frac.is_multiple_of(10) {
        frac /= 10;
        digits -= 1;
    }
    buf.push(b'.');
    pad(buf, frac, digits);
}

fn number(buf: &mut Vec<u8>, n: u64) {
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `n` in at least `width` digits, zero-padded.
fn pad(buf: &mut Vec<u8>, n: u64, width: usize) {
    let mut tmp = [b'0'; 20];
    let mut i = tmp.len();
    let mut n = n;
    while n > 0 || tmp.len() - i < width {
        i -= 1;
        tmp[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    buf.extend_from_slice(&tmp[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(key: &'static str, warn: bool) -> Line<'static> {
        Line {
            request_id: "1E718BC800001F30",
            method: "PUT",
            op: "PutObject",
            bucket: "bench",
            key,
            access_key: "fencegate-demo",
            lock: "",
            resource: "bench/wrk-object",
            token: Some(1),
            highest: None,
            decision: "forwarded",
            payload: "unsigned",
            status: 200,
            bytes_in: 4096,
            elapsed: Duration::from_nanos(79_219_000),
            warn,
        }
    }

    fn at() -> SystemTime {
        // 2026-11-24T02:18:48.778022Z
        UNIX_EPOCH + Duration::from_micros(1_795_486_728_778_022)
    }

    #[test]
    fn human_line_is_what_tracing_writes() {
        let mut buf = Vec::new();
        human(&mut buf, &line("wrk-object", false), at());
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "2026-11-24T02:18:48.778022Z  INFO fencegate::proxy: request \
             request_id=1E718BC800001F30 method=PUT op=\"PutObject\" bucket=\"bench\" \
             key=\"wrk-object\" access_key=\"fencegate-demo\" lock=\"\" resource=\"bench/wrk-object\" \
             token=\"1\" highest=\"\" decision=\"forwarded\" payload=\"unsigned\" status=200 \
             bytes_in=4096 duration_ms=79.219\n"
        );
    }

    #[test]
    fn human_line_escapes_keys_as_debug_does() {
        let mut buf = Vec::new();
        human(&mut buf, &line("a \"q\"\n\u{e9}\\", true), at());
        let s = String::from_utf8(buf).unwrap();
        assert!(s.contains("  WARN fencegate::proxy"), "{s}");
        assert!(s.contains(r#" key="a \"q\"\né\\" "#), "{s}");
    }

    #[test]
    fn json_line_parses_with_every_field() {
        let mut buf = Vec::new();
        json(&mut buf, &line("k\"\u{1}", false), at());
        assert_eq!(buf.last(), Some(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["timestamp"], "2026-11-24T02:18:48.778022Z");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "fencegate::proxy");
        let f = &v["fields"];
        assert_eq!(f["message"], "request");
        assert_eq!(f["key"], "k\"\u{1}");
        assert_eq!(f["token"], "1");
        assert_eq!(f["highest"], "");
        assert_eq!(f["status"], 200);
        assert_eq!(f["bytes_in"], 4096);
        assert_eq!(f["duration_ms"], 79.219);
    }

    /// The hand-made line against `tracing`'s own formatter, for both
    /// formats, on a key that needs escaping (all but the timestamp and the
    /// duration's digits).
    #[test]
    fn lines_match_tracing_fmt() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Capture(Arc<Mutex<Vec<u8>>>);
        impl Write for Capture {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let strip = |s: &str| -> String {
            let s = s.split_once(" duration_ms=").map_or(s, |(a, _)| a);
            let s = s.split_once(",\"duration_ms\"").map_or(s, |(a, _)| a);
            s.split_once('Z').unwrap().1.to_string()
        };
        for json_form in [false, true] {
            let cap = Capture::default();
            let w = cap.clone();
            let builder = tracing_subscriber::fmt()
                .with_writer(move || w.clone())
                .with_ansi(false);
            let l = line("a \"q\"/\u{e9}\\\t", true);
            if json_form {
                tracing::subscriber::with_default(builder.json().finish(), || as_event(&l));
            } else {
                tracing::subscriber::with_default(builder.finish(), || as_event(&l));
            }
            let theirs = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
            let mut ours = Vec::new();
            if json_form {
                json(&mut ours, &l, at());
            } else {
                human(&mut ours, &l, at());
            }
            let ours = String::from_utf8(ours).unwrap();
            assert_eq!(strip(&ours), strip(&theirs), "json: {json_form}");
        }
    }

    #[test]
    fn numbers_and_millis() {
        let mut buf = Vec::new();
        number(&mut buf, 0);
        buf.push(b' ');
        number(&mut buf, u64::MAX);
        buf.push(b' ');
        millis(&mut buf, Duration::from_nanos(1_612_984));
        buf.push(b' ');
        millis(&mut buf, Duration::from_millis(3));
        buf.push(b' ');
        millis(&mut buf, Duration::from_nanos(1_000_001));
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "0 18446744073709551615 1.612984 3 1.000001"
        );
    }
}
