//! The body of DeleteObjects: the keys it names, read from the XML.

use super::error::S3Error;
use quick_xml::Reader;
use quick_xml::events::Event;

/// S3's own limit on keys in one DeleteObjects request.
pub const MAX_KEYS: usize = 1000;
/// The largest DeleteObjects body fencegate reads (1000 keys of 1 KiB fit).
pub const MAX_BODY: usize = 2 * 1024 * 1024;

fn malformed(m: impl std::fmt::Display) -> S3Error {
    S3Error::MalformedXML(format!("DeleteObjects body: {m}"))
}

/// The keys of `<Delete><Object><Key>…</Key></Object>…</Delete>`.
pub fn parse_keys(xml: &[u8]) -> Result<Vec<String>, S3Error> {
    let mut reader = Reader::from_reader(xml);
    reader.config_mut().trim_text(false);
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut keys = Vec::new();
    let mut current: Option<String> = None;
    let mut buf = Vec::new();
    loop {
        match reader.read_event_into(&mut buf).map_err(malformed)? {
            Event::Start(e) => {
                path.push(e.local_name().as_ref().as_bytes().to_vec());
                if path.len() == 3 && path[1] == b"Object" && path[2] == b"Key" {
                    current = Some(String::new());
                }
            }
            Event::End(_) => {
                if path.len() == 3
                    && path[2] == b"Key"
                    && let Some(k) = current.take()
                {
                    keys.push(k);
                    if keys.len() > MAX_KEYS {
                        return Err(malformed(format!("more than {MAX_KEYS} keys")));
                    }
                }
                path.pop();
            }
            Event::Text(t) => {
                if let Some(k) = current.as_mut() {
                    k.push_str(&t.xml10_content());
                }
            }
            Event::GeneralRef(r) => {
                if let Some(k) = current.as_mut() {
                    let name: &str = &r;
                    let ch = match name {
                        "amp" => "&",
                        "lt" => "<",
                        "gt" => ">",
                        "quot" => "\"",
                        "apos" => "'",
                        other => {
                            let c = r
                                .resolve_char_ref()
                                .map_err(malformed)?
                                .ok_or_else(|| malformed(format!("unknown entity {other}")))?;
                            k.push(c);
                            continue;
                        }
                    };
                    k.push_str(ch);
                }
            }
            Event::CData(t) => {
                if let Some(k) = current.as_mut() {
                    k.push_str(&t.xml10_content());
                }
            }
            Event::Eof => break,
            _ => {}
        }
        buf.clear();
    }
    if !path.is_empty() {
        return Err(malformed("unclosed element"));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_keys() {
        let xml = br#"<?xml version="1.0" encoding="UTF-8"?>
<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Quiet>true</Quiet>
<Object><Key>a/b</Key></Object><Object><Key>x&amp;y&#65;</Key><VersionId>v</VersionId></Object></Delete>"#;
        assert_eq!(parse_keys(xml).unwrap(), vec!["a/b", "x&yA"]);
    }

    #[test]
    fn rejects_broken_xml() {
        assert!(parse_keys(b"<Delete><Object><Key>a</Key></Object>").is_err());
        assert!(parse_keys(b"<Delete><Object><Key>a</Object></Delete>").is_err());
    }
}
