//! A multipart object's checksums: the composite of its parts' (S3's
//! `COMPOSITE` type, `<checksum of the parts' checksums>-<N>`), or for a
//! CRC the checksum of the whole object (`FULL_OBJECT`), combined from the
//! parts' CRCs and lengths without reading a byte again; and the checks of
//! what a CompleteMultipartUpload declares, so that a completion whose
//! checksums do not match what was uploaded is refused rather than stored.

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

/// The checksum type of a new upload: what the client asked, or S3's
/// default for its algorithm (`FULL_OBJECT` for CRC64NVME, which has no
/// other, `COMPOSITE` for the rest). SHA-1 and SHA-256 cannot be combined,
/// so they are never `FULL_OBJECT`.
pub(super) fn upload_type(
    algorithm: Option<&str>,
    asked: Option<&str>,
) -> S3Result<Option<String>> {
    let (composite, full) = (ChecksumType::COMPOSITE, ChecksumType::FULL_OBJECT);
    let Some(algorithm) = algorithm else {
        return match asked {
            None => Ok(None),
            Some(_) => Err(s3_error!(
                InvalidRequest,
                "x-amz-checksum-type needs x-amz-checksum-algorithm"
            )),
        };
    };
    let crc = algorithm.starts_with("CRC");
    match asked {
        None if algorithm == "CRC64NVME" => Ok(Some(full.to_string())),
        None => Ok(Some(composite.to_string())),
        Some(t) if t == full && crc => Ok(Some(t.to_string())),
        Some(t) if t == composite && algorithm != "CRC64NVME" => Ok(Some(t.to_string())),
        Some(t) => Err(s3_error!(
            InvalidRequest,
            "the {t} checksum type is not available for {algorithm}"
        )),
    }
}

/// One of S3's CRCs: its reflected polynomial, its width in bits, and
/// where a set of checksums keeps it (to write it; `fields` reads).
struct Crc {
    poly: u64,
    width: usize,
    field: fn(&mut Checksums) -> &mut Option<String>,
}

impl Crc {
    fn named(algorithm: &str) -> Option<Crc> {
        let crc = |poly, width, field| Some(Crc { poly, width, field });
        match algorithm {
            "CRC32" => crc(0xEDB8_8320, 32, |c| &mut c.crc32),
            "CRC32C" => crc(0x82F6_3B78, 32, |c| &mut c.crc32c),
            "CRC64NVME" => crc(0x9A6C_9329_AC4B_C9B5, 64, |c| &mut c.crc64nvme),
            _ => None,
        }
    }
}

/// The `FULL_OBJECT` checksum of a multipart object in `algorithm` (a CRC),
/// from each part's checksum and length; `None` if a part has none.
pub(super) fn full_object(parts: &[(&Checksums, u64)], algorithm: &str) -> Option<Checksums> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let crc = Crc::named(algorithm)?;
    let mut whole = 0u64;
    for (i, (sums, len)) in parts.iter().enumerate() {
        let (_, value) = fields(sums).into_iter().find(|(n, _)| *n == algorithm)?;
        let bytes = b64.decode(value.as_ref()?).ok()?;
        let part = bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        whole = match i {
            0 => part,
            _ => crc_combine(whole, part, *len, crc.poly, crc.width),
        };
    }
    let bytes = whole.to_be_bytes();
    let mut out = Checksums {
        kind: Some(ChecksumType::FULL_OBJECT.to_string()),
        ..Checksums::default()
    };
    *(crc.field)(&mut out) = Some(b64.encode(&bytes[8 - crc.width / 8..]));
    Some(out)
}

/// The CRC of `a ++ b` from the CRCs of `a` and `b` and the length of `b`
/// (zlib's `crc32_combine`, for any reflected CRC whose initial value and
/// final XOR are equal, as S3's three are): `crc_a` is carried through
/// `len_b` zero bytes, then XORed with `crc_b`.
fn crc_combine(crc_a: u64, crc_b: u64, len_b: u64, poly: u64, width: usize) -> u64 {
    fn times(mat: &[u64], mut vec: u64) -> u64 {
        let mut sum = 0;
        let mut i = 0;
        while vec != 0 {
            if vec & 1 != 0 {
                sum ^= mat[i];
            }
            vec >>= 1;
            i += 1;
        }
        sum
    }
    fn square(mat: &[u64]) -> Vec<u64> {
        mat.iter().map(|&row| times(mat, row)).collect()
    }
    if len_b == 0 {
        return crc_a;
    }
    // The operator that carries a CRC through one zero bit, squared three
    // times: through one zero byte. Then, squared on, through 2, 4, 8...
    // bytes, applied for each bit set in `len_b`.
    let mut op: Vec<u64> = (0..width)
        .map(|n| if n == 0 { poly } else { 1 << (n - 1) })
        .collect();
    for _ in 0..3 {
        op = square(&op);
    }
    let (mut crc, mut len) = (crc_a, len_b);
    while len != 0 {
        if len & 1 != 0 {
            crc = times(&op, crc);
        }
        len >>= 1;
        if len != 0 {
            op = square(&op);
        }
    }
    crc ^ crc_b
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

/// A checksum the completion declares for the whole object must be the
/// object's. Of a `FULL_OBJECT` upload, that is its CRC. Otherwise it is
/// the composite checksum: SHA-1 and SHA-256 are composite whatever the
/// value looks like, a CRC when it ends in `-<N>`; a CRC without the suffix
/// declared for a composite upload is a full-object CRC the upload did not
/// ask for, and is left unchecked (docs/embedded-store.md).
pub(super) fn check_object(declared: &Checksums, object: &Checksums, parts: usize) -> S3Result<()> {
    let full = object.kind.as_deref() == Some(ChecksumType::FULL_OBJECT);
    for ((name, want), (_, have)) in fields(declared).into_iter().zip(fields(object)) {
        let Some(want) = want else { continue };
        if full {
            if have.as_ref() != Some(want) {
                return Err(s3_error!(
                    BadDigest,
                    "the {name} checksum the completion declares is not the object's"
                ));
            }
            continue;
        }
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

    #[test]
    fn full_object_crcs_are_the_crc_of_the_whole_body() {
        use base64::Engine;
        use s3s::crypto::Checksum;
        fn of<H: Checksum>(mut h: H, body: &[u8]) -> String {
            h.update(body);
            base64::engine::general_purpose::STANDARD.encode(h.finalize().as_ref())
        }
        let a = vec![7u8; 5 << 20];
        let b = b"and the last part".to_vec();
        let c = b"".to_vec();
        let whole = [a.clone(), b.clone(), c.clone()].concat();
        type Hashing = (&'static str, fn(&[u8]) -> String);
        let algorithms: [Hashing; 3] = [
            ("CRC32", |x| of(s3s::crypto::Crc32::new(), x)),
            ("CRC32C", |x| of(s3s::crypto::Crc32c::new(), x)),
            ("CRC64NVME", |x| of(s3s::crypto::Crc64Nvme::new(), x)),
        ];
        for (name, hash) in algorithms {
            let part = |body: &[u8]| {
                let v = Some(hash(body));
                let mut s = Checksums::default();
                match name {
                    "CRC32" => s.crc32 = v,
                    "CRC32C" => s.crc32c = v,
                    _ => s.crc64nvme = v,
                }
                s
            };
            let (pa, pb, pc) = (part(&a), part(&b), part(&c));
            let got = full_object(
                &[(&pa, a.len() as u64), (&pb, b.len() as u64), (&pc, 0)],
                name,
            )
            .unwrap();
            let want = hash(&whole);
            let have = fields(&got)
                .into_iter()
                .find(|(n, _)| *n == name)
                .and_then(|(_, v)| v.clone());
            assert_eq!(have.as_deref(), Some(want.as_str()), "{name}");
            assert!(check_object(&part(&whole), &got, 3).is_ok(), "{name}");
            assert!(check_object(&pa, &got, 3).is_err(), "{name}");
        }
        assert_eq!(
            upload_type(Some("CRC64NVME"), None).unwrap().as_deref(),
            Some("FULL_OBJECT")
        );
        assert_eq!(
            upload_type(Some("CRC32"), None).unwrap().as_deref(),
            Some("COMPOSITE")
        );
        assert!(upload_type(Some("SHA256"), Some("FULL_OBJECT")).is_err());
        assert!(upload_type(Some("CRC64NVME"), Some("COMPOSITE")).is_err());
        assert!(upload_type(None, Some("COMPOSITE")).is_err());
    }
}
