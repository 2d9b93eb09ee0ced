//! The backend's XML answers that fencegate reads for a decision: the
//! upload id of a CreateMultipartUpload (its token is remembered), the
//! bucket list shown to a limited credential (and the first bucket, where
//! the probe of `upstream::probe` writes), and the `<Error>` a backend
//! may send inside a `200` answer. One parser (quick-xml) reads all of
//! them; nothing here scans XML text by hand.

use quick_xml::events::Event;
use quick_xml::{Reader, Writer};

/// The text of the first element named `name` at `depth` (1 = the root's
/// children), entities resolved.
fn text_at(xml: &[u8], depth: usize, name: &str) -> Option<String> {
    let mut reader = Reader::from_reader(xml);
    let mut path: Vec<String> = Vec::new();
    let mut text: Option<String> = None;
    let mut buf = Vec::new();
    loop {
        match reader.read_event_into(&mut buf).ok()? {
            Event::Start(e) => {
                path.push(e.local_name().as_ref().to_string());
                if path.len() == depth + 1 && path[depth] == name {
                    text = Some(String::new());
                }
            }
            Event::End(_) => {
                if text.is_some() && path.len() == depth + 1 {
                    return text;
                }
                path.pop();
            }
            Event::Text(t) => {
                if let Some(s) = text.as_mut() {
                    s.push_str(&t.xml10_content());
                }
            }
            Event::CData(t) => {
                if let Some(s) = text.as_mut() {
                    s.push_str(&t.xml10_content());
                }
            }
            Event::GeneralRef(r) => {
                if let Some(s) = text.as_mut() {
                    s.push_str(&resolve(&r)?);
                }
            }
            Event::Eof => return None,
            _ => {}
        }
        buf.clear();
    }
}

/// A predefined entity or a character reference.
fn resolve(r: &quick_xml::events::BytesRef<'_>) -> Option<String> {
    if let Ok(Some(c)) = r.resolve_char_ref() {
        return Some(c.to_string());
    }
    predefined_entity(r).map(str::to_string)
}

/// The text of one of XML's five predefined entities, by name.
pub(super) fn predefined_entity(name: &str) -> Option<&'static str> {
    Some(match name {
        "amp" => "&",
        "lt" => "<",
        "gt" => ">",
        "quot" => "\"",
        "apos" => "'",
        _ => return None,
    })
}

/// The `<UploadId>` of an `<InitiateMultipartUploadResult>`.
pub fn upload_id(body: &[u8]) -> Option<String> {
    text_at(body, 1, "UploadId")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Whether a document is an S3 `<Error>` (as a backend may send inside a
/// `200` answer to CompleteMultipartUpload or a copy).
pub fn is_error(body: &[u8]) -> bool {
    let mut reader = Reader::from_reader(body);
    let mut buf = Vec::new();
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(Event::Start(e)) | Ok(Event::Empty(e)) => {
                return e.local_name().as_ref() == "Error";
            }
            Ok(Event::Eof) | Err(_) => return false,
            _ => {}
        }
        buf.clear();
    }
}

/// A ListAllMyBucketsResult with only the `<Bucket>` entries whose name
/// passes `allowed`. `None` if the document does not parse.
pub fn keep_buckets(xml: &[u8], allowed: impl Fn(&str) -> bool) -> Option<Vec<u8>> {
    let mut reader = Reader::from_reader(xml);
    let mut writer = Writer::new(Vec::with_capacity(xml.len()));
    let mut depth = 0usize;
    // The events of the `<Bucket>` being read, written once its name is known.
    let mut entry: Option<Vec<Event<'static>>> = None;
    let mut buf = Vec::new();
    loop {
        let ev = reader.read_event_into(&mut buf).ok()?.into_owned();
        match &ev {
            Event::Eof => break,
            Event::Start(e) => {
                depth += 1;
                if depth == 3 && e.local_name().as_ref() == "Bucket" {
                    entry = Some(Vec::new());
                }
            }
            Event::End(_) => depth = depth.checked_sub(1)?,
            _ => {}
        }
        match entry.as_mut() {
            Some(events) => {
                events.push(ev.clone());
                if depth == 2 {
                    let events = entry.take()?;
                    let mut one = Vec::new();
                    let mut w = Writer::new(&mut one);
                    for e in &events {
                        w.write_event(e.borrow()).ok()?;
                    }
                    let name = text_at(&one, 1, "Name").unwrap_or_default();
                    if allowed(&name) {
                        writer.get_mut().extend_from_slice(&one);
                    }
                }
            }
            None => writer.write_event(ev).ok()?,
        }
        buf.clear();
    }
    Some(writer.into_inner())
}

/// The names of a ListAllMyBucketsResult's buckets, in its order.
pub fn bucket_names(xml: &[u8]) -> Vec<String> {
    let names = std::cell::RefCell::new(Vec::new());
    keep_buckets(xml, |n| {
        names.borrow_mut().push(n.to_string());
        false
    });
    names.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_upload_id() {
        let xml = b"<?xml version=\"1.0\"?><InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>abc&amp;1</UploadId></InitiateMultipartUploadResult>";
        assert_eq!(upload_id(xml).as_deref(), Some("abc&1"));
        assert_eq!(upload_id(b"<x/>"), None);
        assert_eq!(
            upload_id(b"<R><UploadId>a<!-- c -->b</UploadId></R>").as_deref(),
            Some("ab")
        );
    }

    #[test]
    fn tells_an_error_document() {
        assert!(is_error(
            b"\n\n  <?xml version=\"1.0\"?><Error><Code>InternalError</Code></Error>"
        ));
        assert!(!is_error(b"<CompleteMultipartUploadResult/>"));
        assert!(!is_error(b"   "));
    }

    #[test]
    fn keep_buckets_filters_entries() {
        let xml = b"<ListAllMyBucketsResult><Owner><ID>o</ID></Owner><Buckets><Bucket><Name>a</Name><CreationDate>d</CreationDate></Bucket><Bucket><Name>b</Name><CreationDate>d</CreationDate></Bucket></Buckets></ListAllMyBucketsResult>";
        let kept = String::from_utf8(keep_buckets(xml, |b| b == "b").unwrap()).unwrap();
        assert!(!kept.contains("<Name>a</Name>"), "{kept}");
        assert!(kept.contains("<Name>b</Name>"), "{kept}");
        assert!(
            kept.ends_with("</Buckets></ListAllMyBucketsResult>"),
            "{kept}"
        );
        assert_eq!(bucket_names(xml), ["a", "b"]);
        // A name hidden in a comment is read the way an SDK reads it.
        let tricky = b"<L><Buckets><Bucket><Name>a<!-- -->x</Name></Bucket></Buckets></L>";
        let kept = String::from_utf8(keep_buckets(tricky, |b| b == "a").unwrap()).unwrap();
        assert!(!kept.contains("Bucket>"), "{kept}");
    }
}
