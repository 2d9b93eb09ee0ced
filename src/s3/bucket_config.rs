//! CreateBucket's body, read once and written again for the backend.
//!
//! Its `<LocationConstraint>` names the region to make the bucket in. A
//! client names the region it sees, fencegate's own (`server.region`, the
//! one it signs for), but the backend has a region of its own and refuses
//! any other (Garage: "buckets can only be created in region `garage`";
//! AWS: `IllegalLocationConstraintException`). So the backend gets the
//! constraint for its region, and no body at all when that is
//! `us-east-1`, which AWS wants left unsaid. A constraint naming a region
//! other than fencegate's is refused as AWS refuses it, and an element
//! fencegate would not carry over is refused rather than dropped.

use super::error::S3Error;
use super::xml::predefined_entity;
use quick_xml::Reader;
use quick_xml::events::Event;

/// The largest CreateBucket body fencegate reads.
pub const MAX_BODY: usize = 64 * 1024;

fn malformed(m: impl std::fmt::Display) -> S3Error {
    S3Error::MalformedXML(format!("CreateBucketConfiguration: {m}"))
}

/// The `<LocationConstraint>` of a CreateBucket body (`None`: no body, or
/// none named).
pub fn location_constraint(xml: &[u8]) -> Result<Option<String>, S3Error> {
    if xml.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let mut reader = Reader::from_reader(xml);
    let mut path: Vec<String> = Vec::new();
    let mut constraint: Option<String> = None;
    let mut buf = Vec::new();
    loop {
        let in_constraint = path.len() == 2;
        match reader.read_event_into(&mut buf).map_err(malformed)? {
            Event::Start(e) => {
                let name = e.local_name().as_ref().to_string();
                match (path.len(), name.as_str()) {
                    (0, "CreateBucketConfiguration") => {}
                    (1, "LocationConstraint") if constraint.is_none() => {
                        constraint = Some(String::new())
                    }
                    (1, other) => {
                        return Err(S3Error::NotImplemented(format!(
                            "CreateBucketConfiguration's <{other}> is not forwarded by fencegate"
                        )));
                    }
                    _ => return Err(malformed(format!("unexpected element <{name}>"))),
                }
                path.push(name);
            }
            Event::Empty(e) => {
                let name = e.local_name().as_ref().to_string();
                match (path.len(), name.as_str()) {
                    (0, "CreateBucketConfiguration") => return Ok(None),
                    (1, "LocationConstraint") => {}
                    _ => return Err(malformed(format!("unexpected element <{name}/>"))),
                }
            }
            Event::End(_) => {
                path.pop();
            }
            Event::Text(t) if in_constraint => {
                constraint
                    .get_or_insert_default()
                    .push_str(&t.xml10_content());
            }
            Event::GeneralRef(r) if in_constraint => {
                let c = match r.resolve_char_ref().map_err(malformed)? {
                    Some(c) => c.to_string(),
                    None => predefined_entity(&r)
                        .ok_or_else(|| malformed("an unknown entity"))?
                        .to_string(),
                };
                constraint.get_or_insert_default().push_str(&c);
            }
            Event::Text(t) if t.xml10_content().trim().is_empty() => {}
            Event::Text(_) | Event::CData(_) | Event::GeneralRef(_) => {
                return Err(malformed("text outside <LocationConstraint>"));
            }
            Event::DocType(_) => return Err(malformed("a DOCTYPE is not accepted")),
            Event::Eof => break,
            _ => {}
        }
        buf.clear();
    }
    if !path.is_empty() {
        return Err(malformed("not a complete document"));
    }
    Ok(constraint
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty()))
}

/// The body the backend gets for a CreateBucket whose body was `xml`, when
/// clients see `region` and the backend is in `backend_region`.
pub fn for_backend(xml: &[u8], region: &str, backend_region: &str) -> Result<String, S3Error> {
    if let Some(asked) = location_constraint(xml)?
        && asked != region
    {
        return Err(S3Error::IllegalLocationConstraint(format!(
            "the {asked} location constraint is incompatible with this endpoint's region, {region}"
        )));
    }
    if backend_region == "us-east-1" {
        return Ok(String::new());
    }
    Ok(format!(
        "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LocationConstraint>{}</LocationConstraint></CreateBucketConfiguration>",
        super::error::xml_escape(backend_region)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: &[u8] = b"<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LocationConstraint>us-east-1</LocationConstraint></CreateBucketConfiguration>";

    #[test]
    fn the_backend_gets_its_own_region() {
        let garage = for_backend(US, "us-east-1", "garage").unwrap();
        assert_eq!(
            location_constraint(garage.as_bytes()).unwrap().as_deref(),
            Some("garage")
        );
        assert_eq!(for_backend(b"", "us-east-1", "garage").unwrap(), garage);
        assert_eq!(for_backend(US, "us-east-1", "us-east-1").unwrap(), "");
        let eu = b"<CreateBucketConfiguration><LocationConstraint>eu-west-1</LocationConstraint></CreateBucketConfiguration>";
        let e = for_backend(eu, "us-east-1", "garage").unwrap_err();
        assert_eq!(e.code(), "IllegalLocationConstraintException");
        assert!(for_backend(eu, "eu-west-1", "garage").is_ok());
    }

    #[test]
    fn reads_strictly() {
        assert_eq!(location_constraint(b"  ").unwrap(), None);
        assert_eq!(
            location_constraint(b"<CreateBucketConfiguration/>").unwrap(),
            None
        );
        assert_eq!(
            location_constraint(
                b"<CreateBucketConfiguration><LocationConstraint/></CreateBucketConfiguration>"
            )
            .unwrap(),
            None
        );
        for bad in [
            &b"<CreateBucketConfiguration><LocationConstraint>a</LocationConstraint>"[..],
            b"<Other><LocationConstraint>a</LocationConstraint></Other>",
            b"<CreateBucketConfiguration><Bucket><Type>Directory</Type></Bucket></CreateBucketConfiguration>",
            b"<CreateBucketConfiguration>x<LocationConstraint>a</LocationConstraint></CreateBucketConfiguration>",
            b"<CreateBucketConfiguration><LocationConstraint>a</LocationConstraint><LocationConstraint>b</LocationConstraint></CreateBucketConfiguration>",
        ] {
            assert!(
                location_constraint(bad).is_err(),
                "{:?} accepted",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
