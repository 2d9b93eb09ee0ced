//! The body of DeleteObjects, read once and written again.
//!
//! XML parsers disagree on a key like `k<![CDATA[x]]>` or `k<!---->x`: one
//! reads `kx`, another keeps the first text piece, `k`. So fencegate never
//! forwards the client's XML. It reads it strictly with one parser
//! (quick-xml), fences the keys it read, and sends the backend a canonical
//! body built from those keys ([`Delete::to_xml`]): no comments, no CDATA,
//! no prefixes, only the five predefined escapes, and white space in keys
//! as character references (`&#32;`), which readers that trim the text
//! around a value do not trim. The backend then deletes exactly what was
//! fenced; the differential test checks it on every backend.
//!
//! Each `Object` may carry the conditions of a conditional delete
//! (`ETag`, `LastModifiedTime`, `Size`: CONTRACT §8). fencegate judges them
//! itself, under the object's hold, and the backend gets only the keys
//! whose conditions held, without them.
//!
//! Refused (`400 MalformedXML`): a DOCTYPE, an unknown entity, a root other
//! than `Delete`, an `Object` without exactly one `Key`, an element fencegate
//! does not know, text outside the elements above, and more than 1000 keys.
//! Keys are checked like any key (`names::check_key`).

use super::conditions::{Conditions, bare_etag, parse_time};
use super::error::S3Error;
use super::error::xml_escape;
use super::names::check_key;
use super::xml::predefined_entity;
use quick_xml::Reader;
use quick_xml::events::Event;

/// S3's own limit on keys in one DeleteObjects request.
pub const MAX_KEYS: usize = 1000;
/// The largest DeleteObjects body fencegate reads (1000 keys of 1 KiB fit).
pub const MAX_BODY: usize = 2 * 1024 * 1024;

/// One object to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToDelete {
    pub key: String,
    pub version_id: Option<String>,
    /// Its `ETag`, `LastModifiedTime` and `Size`, when it has any.
    pub conditions: Option<Conditions>,
}

/// The fields of an `<Object>` as they are read.
#[derive(Default)]
struct Fields {
    key: Option<String>,
    version_id: Option<String>,
    etag: Option<String>,
    last_modified: Option<String>,
    size: Option<String>,
}

impl Fields {
    fn slot(&mut self, field: &str) -> &mut Option<String> {
        match field {
            "Key" => &mut self.key,
            "VersionId" => &mut self.version_id,
            "ETag" => &mut self.etag,
            "LastModifiedTime" => &mut self.last_modified,
            _ => &mut self.size,
        }
    }

    fn conditions(&self) -> Result<Option<Conditions>, S3Error> {
        let mut c = Conditions::default();
        if let Some(e) = &self.etag {
            c.if_match = Some(bare_etag(e).to_string());
        }
        if let Some(t) = &self.last_modified {
            let secs = parse_time(t.trim())
                .ok_or_else(|| malformed(format!("<LastModifiedTime> {t:?} is not a time")))?;
            c.last_modified = Some(secs);
        }
        if let Some(n) = &self.size {
            let n = n
                .trim()
                .parse()
                .map_err(|_| malformed(format!("<Size> {n:?} is not a size")))?;
            c.size = Some(n);
        }
        Ok((c != Conditions::default()).then_some(c))
    }
}

/// The `<Object>` fields that carry text.
const FIELDS: [&str; 5] = ["Key", "VersionId", "ETag", "LastModifiedTime", "Size"];

/// A DeleteObjects request body as fencegate read it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Delete {
    pub quiet: bool,
    pub objects: Vec<ToDelete>,
}

fn malformed(m: impl std::fmt::Display) -> S3Error {
    S3Error::MalformedXML(format!("DeleteObjects body: {m}"))
}

/// The text of the element being read, if it is one that carries text.
#[derive(Default)]
struct Open {
    /// Element names from the root down.
    path: Vec<String>,
    text: String,
    object: Option<Fields>,
}

impl Open {
    fn text_allowed(&self) -> bool {
        let p: Vec<&str> = self.path.iter().map(String::as_str).collect();
        match p.as_slice() {
            ["Delete", "Quiet"] => true,
            ["Delete", "Object", f] => FIELDS.contains(f),
            _ => false,
        }
    }
}

impl Delete {
    /// Reads `<Delete><Quiet>…</Quiet><Object><Key>…</Key><VersionId>…
    /// </VersionId></Object>…</Delete>` (see the module doc).
    pub fn parse(xml: &[u8]) -> Result<Delete, S3Error> {
        let mut reader = Reader::from_reader(xml);
        reader.config_mut().trim_text(false);
        let mut st = Open::default();
        let mut out = Delete::default();
        let mut seen_root = false;
        let mut buf = Vec::new();
        loop {
            match reader.read_event_into(&mut buf).map_err(malformed)? {
                Event::Start(e) => {
                    let name = e.local_name().as_ref().to_string();
                    st.path.push(name);
                    st.text.clear();
                    let p: Vec<&str> = st.path.iter().map(String::as_str).collect();
                    match p.as_slice() {
                        ["Delete"] if !seen_root => seen_root = true,
                        ["Delete", "Quiet"] => {}
                        ["Delete", "Object"] => st.object = Some(Fields::default()),
                        ["Delete", "Object", f] if FIELDS.contains(f) => {}
                        _ => {
                            return Err(malformed(format!("unexpected element <{}>", p.join("/"))));
                        }
                    }
                }
                Event::Empty(e) => {
                    let name = e.local_name().as_ref().to_string();
                    return Err(malformed(format!("unexpected empty element <{name}/>")));
                }
                Event::End(_) => {
                    st.close(&mut out)?;
                    st.path.pop();
                }
                Event::Text(t) => {
                    let text = t.xml10_content();
                    st.push_text(&text)?;
                }
                Event::CData(t) => {
                    let text = t.xml10_content();
                    st.push_text(&text)?;
                }
                Event::GeneralRef(r) => {
                    let ch = match r.resolve_char_ref().map_err(malformed)? {
                        Some(c) => c.to_string(),
                        None => {
                            let name: &str = &r;
                            predefined_entity(name)
                                .ok_or_else(|| malformed(format!("unknown entity &{name};")))?
                                .to_string()
                        }
                    };
                    st.push_text(&ch)?;
                }
                Event::DocType(_) => return Err(malformed("a DOCTYPE is not accepted")),
                Event::Eof => break,
                // The XML declaration, comments and processing instructions
                // carry nothing.
                _ => {}
            }
            buf.clear();
        }
        if !seen_root || !st.path.is_empty() {
            return Err(malformed("not a complete <Delete> document"));
        }
        Ok(out)
    }

    /// The canonical body fencegate forwards.
    pub fn to_xml(&self) -> String {
        let mut s = String::with_capacity(64 + self.objects.len() * 64);
        s.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Delete xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
        if self.quiet {
            s.push_str("<Quiet>true</Quiet>");
        }
        for o in &self.objects {
            s.push_str("<Object><Key>");
            s.push_str(&key_xml(&o.key));
            s.push_str("</Key>");
            if let Some(v) = &o.version_id {
                s.push_str("<VersionId>");
                s.push_str(&xml_escape(v));
                s.push_str("</VersionId>");
            }
            s.push_str("</Object>");
        }
        s.push_str("</Delete>");
        s
    }
}

/// A key as the canonical body spells it: escaped, and every white-space
/// character as a character reference, so that a reader that trims the
/// white space around a text (some do) still reads the key whole.
fn key_xml(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if c.is_whitespace() {
            out.push_str(&format!("&#{};", c as u32));
        } else {
            out.push_str(&xml_escape(c.encode_utf8(&mut [0; 4])));
        }
    }
    out
}

impl Open {
    fn push_text(&mut self, t: &str) -> Result<(), S3Error> {
        if self.text_allowed() {
            self.text.push_str(t);
            Ok(())
        } else if t.trim().is_empty() {
            Ok(())
        } else {
            Err(malformed(
                "text outside an object's <Key>, <VersionId>, <ETag>, \
                 <LastModifiedTime> and <Size>, and <Quiet>",
            ))
        }
    }

    /// The element on top of `path` ends.
    fn close(&mut self, out: &mut Delete) -> Result<(), S3Error> {
        let p: Vec<&str> = self.path.iter().map(String::as_str).collect();
        let text = std::mem::take(&mut self.text);
        match p.as_slice() {
            ["Delete", "Quiet"] => {
                out.quiet = match text.trim() {
                    "true" => true,
                    "false" => false,
                    other => return Err(malformed(format!("<Quiet> is {other:?}"))),
                }
            }
            ["Delete", "Object", field] => {
                let fields = self.object.as_mut().expect("inside <Object>");
                if fields.slot(field).replace(text).is_some() {
                    return Err(malformed(format!("an <Object> with two <{field}>")));
                }
            }
            ["Delete", "Object"] => {
                let fields = self.object.take().expect("inside <Object>");
                let conditions = fields.conditions()?;
                let version_id = fields.version_id;
                if conditions.is_some() && version_id.is_some() {
                    return Err(S3Error::NotImplemented(
                        "conditions on the delete of a given version (<VersionId> with \
                         <ETag>, <LastModifiedTime> or <Size>) are not implemented"
                            .into(),
                    ));
                }
                let key = fields
                    .key
                    .ok_or_else(|| malformed("an <Object> without <Key>"))?;
                check_key(&key)?;
                out.objects.push(ToDelete {
                    key,
                    version_id,
                    conditions,
                });
                if out.objects.len() > MAX_KEYS {
                    return Err(malformed(format!("more than {MAX_KEYS} keys")));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(xml: &[u8]) -> Vec<String> {
        Delete::parse(xml)
            .unwrap()
            .objects
            .into_iter()
            .map(|o| o.key)
            .collect()
    }

    #[test]
    fn reads_keys_and_versions() {
        let xml = br#"<?xml version="1.0" encoding="UTF-8"?>
<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Quiet>true</Quiet>
<Object><Key>a/b</Key></Object><Object><Key>x&amp;y&#65;</Key><VersionId>v</VersionId></Object></Delete>"#;
        let d = Delete::parse(xml).unwrap();
        assert!(d.quiet);
        assert_eq!(keys(xml), vec!["a/b", "x&yA"]);
        assert_eq!(d.objects[1].version_id.as_deref(), Some("v"));
    }

    #[test]
    fn white_space_in_keys_is_kept_and_forwarded_as_references() {
        let d = Delete::parse(
            b"<Delete><Object><Key> k </Key></Object><Object><Key>a b</Key></Object></Delete>",
        )
        .unwrap();
        assert_eq!(keys(&d.to_xml().into_bytes()), [" k ", "a b"]);
        let xml = d.to_xml();
        assert!(
            xml.contains("<Key>&#32;k&#32;</Key>") && xml.contains("<Key>a&#32;b</Key>"),
            "{xml}"
        );
    }

    #[test]
    fn conditions_are_read_per_object_and_not_forwarded() {
        let d = Delete::parse(
            b"<Delete><Object><Key>a</Key><ETag>\"e1\"</ETag></Object>\
              <Object><Key>b</Key><LastModifiedTime>2023-11-14T22:13:20.000Z</LastModifiedTime>\
              <Size>5</Size></Object><Object><Key>c</Key></Object></Delete>",
        )
        .unwrap();
        let c = |i: usize| d.objects[i].conditions.clone();
        assert_eq!(c(0).unwrap().if_match.as_deref(), Some("e1"));
        assert_eq!(c(1).unwrap().last_modified, Some(1_700_000_000));
        assert_eq!(c(1).unwrap().size, Some(5));
        assert_eq!(c(2), None);
        let xml = d.to_xml();
        assert!(!xml.contains("ETag") && !xml.contains("Size"), "{xml}");
    }

    #[test]
    fn comments_and_cdata_are_read_whole_and_forwarded_plain() {
        let d = Delete::parse(b"<Delete><Object><Key>k<![CDATA[x]]></Key></Object><Object><Key>k<!---->y</Key></Object></Delete>").unwrap();
        assert_eq!(d.objects[0].key, "kx");
        assert_eq!(d.objects[1].key, "ky");
        let xml = d.to_xml();
        assert!(!xml.contains("CDATA") && !xml.contains("<!--"), "{xml}");
        assert_eq!(Delete::parse(xml.as_bytes()).unwrap(), d);
    }

    #[test]
    fn rejects_what_it_would_not_forward_faithfully() {
        for bad in [
            &b"<Delete><Object><Key>a</Key></Object>"[..],
            b"<Delete><Object><Key>a</Object></Delete>",
            b"<Delete><Object><Key>a</Key><Key>b</Key></Object></Delete>",
            b"<Delete><Object><VersionId>v</VersionId></Object></Delete>",
            b"<Delete><Object><Key>a</Key><Owner>e</Owner></Object></Delete>",
            b"<Delete><Object><Key>a</Key><Size>-1</Size></Object></Delete>",
            b"<Delete><Object><Key>a</Key><ETag>e</ETag><ETag>f</ETag></Object></Delete>",
            b"<Delete><Object><Key>x/../k</Key></Object></Delete>",
            b"<Delete><Object><Key>&ent;</Key></Object></Delete>",
            b"<!DOCTYPE d [<!ENTITY e \"k\">]><Delete><Object><Key>a</Key></Object></Delete>",
            b"<Other><Object><Key>a</Key></Object></Other>",
            b"<Delete>stray<Object><Key>a</Key></Object></Delete>",
            b"<Delete><Object><Key>a</Key></Object></Delete><Delete></Delete>",
            b"<Delete><Quiet>yes</Quiet></Delete>",
        ] {
            assert!(
                Delete::parse(bad).is_err(),
                "{:?} accepted",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
