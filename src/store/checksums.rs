//! A multipart object's checksums: the composite of its parts' (S3's
//! `COMPOSITE` type, `<checksum of the parts' checksums>-<N>`), and the
//! checks of what a CompleteMultipartUpload declares, so that a completion
//! whose checksums do not match what was uploaded is refused rather than
//! stored.

use super::index::Checksums;
use s3s::dto::ChecksumType;
use s3s::{S3Result, s3_error};

/// The composite checksums of a multipart object: each algorithm every
/// part has, as the checksum of the parts' checksums, `-N`.
pub(super) fn composite(parts: &[&Checksums]) -> Checksums {
    use s3s::crypto::Checksum;
    fn of<H: Checksum>(mut h: H, sums: &[Option<&String>]) -> Option<String> {
        if sums.is_empty() || sums.iter().any(Option::is_none) {
            return None;
        }
        for s in sums.iter().flatten() {
            h.update(
                &base64::Engine::decode(&base64::engine::general_purpose::STANDARD, s.as_bytes())
                    .ok()?,
            );
        }
        let sum = h.finalize();
        Some(format!(
            "{}-{}",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, sum.as_ref()),
            sums.len()
        ))
    }
    let col = |f: fn(&Checksums) -> &Option<String>| {
        parts.iter().map(|c| f(c).as_ref()).collect::<Vec<_>>()
    };
    let c = Checksums {
        crc32: of(s3s::crypto::Crc32::new(), &col(|c| &c.crc32)),
        crc32c: of(s3s::crypto::Crc32c::new(), &col(|c| &c.crc32c)),
        crc64nvme: None,
        sha1: of(s3s::crypto::Sha1::new(), &col(|c| &c.sha1)),
        sha256: of(s3s::crypto::Sha256::new(), &col(|c| &c.sha256)),
        kind: None,
    };
    let any = c.crc32.is_some() || c.crc32c.is_some() || c.sha1.is_some() || c.sha256.is_some();
    Checksums {
        kind: any.then(|| ChecksumType::COMPOSITE.to_string()),
        ..c
    }
}

/// The checksums of a set, by algorithm, each with its name.
fn fields(c: &Checksums) -> [(&'static str, &Option<String>); 5] {
    [
        ("CRC32", &c.crc32),
        ("CRC32C", &c.crc32c),
        ("CRC64NVME", &c.crc64nvme),
        ("SHA1", &c.sha1),
        ("SHA256", &c.sha256),
    ]
}

/// A part listed with checksums must have been uploaded with those very
/// checksums.
pub(super) fn check_part(n: i32, declared: &Checksums, stored: &Checksums) -> S3Result<()> {
    for ((name, want), (_, have)) in fields(declared).into_iter().zip(fields(stored)) {
        if let Some(want) = want
            && have.as_ref() != Some(want)
        {
            return Err(s3_error!(
                InvalidPart,
                "part {n}'s {name} checksum is not the one it was uploaded with"
            ));
        }
    }
    Ok(())
}

/// A checksum the completion declares for the whole object must be its
/// composite checksum. SHA-1 and SHA-256 are composite in S3 whatever the
/// value looks like; a CRC is composite when it ends in `-<N>`. A CRC
/// without the suffix is a `FULL_OBJECT` checksum, which this store does
/// not compute and leaves unchecked (docs/embedded-store.md).
pub(super) fn check_object(declared: &Checksums, object: &Checksums, parts: usize) -> S3Result<()> {
    for ((name, want), (_, have)) in fields(declared).into_iter().zip(fields(object)) {
        let Some(want) = want else { continue };
        let suffixed = want
            .rsplit_once('-')
            .is_some_and(|(_, n)| n.parse::<usize>().is_ok());
        if !suffixed && !name.starts_with("SHA") {
            continue;
        }
        let want = match suffixed {
            true => want.clone(),
            false => format!("{want}-{parts}"),
        };
        if have.as_ref() != Some(&want) {
            return Err(s3_error!(
                BadDigest,
                "the {name} checksum the completion declares is not the object's \
                 (the composite of its parts' {name} checksums)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums(crc32: Option<&str>, sha256: Option<&str>) -> Checksums {
        Checksums {
            crc32: crc32.map(String::from),
            sha256: sha256.map(String::from),
            ..Checksums::default()
        }
    }

    #[test]
    fn declared_checksums_must_be_what_was_stored() {
        let sha = "arcu6553sHVAiX4MjW0j7I7vD4w6R+Gz9Ok0Q9lTa+0=";
        let part = sums(Some("AAAAAA=="), Some(sha));
        assert!(check_part(1, &sums(Some("AAAAAA=="), None), &part).is_ok());
        assert!(check_part(1, &Checksums::default(), &part).is_ok());
        assert!(check_part(1, &sums(Some("BBBBBB=="), None), &part).is_err());
        assert!(check_part(1, &sums(None, None), &Checksums::default()).is_ok());
        assert!(check_part(1, &sums(None, Some(sha)), &Checksums::default()).is_err());

        let object = composite(&[&part, &part]);
        let c = object.crc32.clone().unwrap();
        assert!(c.ends_with("-2"), "{c}");
        assert!(check_object(&sums(Some(&c), None), &object, 2).is_ok());
        // A CRC without -N is a FULL_OBJECT checksum: not checked here.
        assert!(check_object(&sums(Some("AAAAAA=="), None), &object, 2).is_ok());
        assert!(check_object(&sums(Some("AAAAAA==-2"), None), &object, 2).is_err());
        // SHA-256 is always composite, with or without its suffix.
        let s = object.sha256.clone().unwrap();
        let bare = s.trim_end_matches("-2");
        assert!(check_object(&sums(None, Some(bare)), &object, 2).is_ok());
        assert!(check_object(&sums(None, Some("bad")), &object, 2).is_err());
    }
}
