//! The keys of SigV4: the signing key a secret derives for a day, region
//! and service, the HMAC it keys, and the cache that keeps the last one
//! (and the last signature begun with it) so that a request pays for
//! neither again. Both directions sign with them: verifying a client
//! (`auth`), signing for the backend (`sign`).

use super::sigv4::{hex_into, hex_lower, push_hex};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

pub fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// The SigV4 signing key for `date` (YYYYMMDD), `region` and `service`.
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    hmac(&k, b"aws4_request")
}

/// A signing key as the HMAC it keys: its inner and outer pads hashed
/// once, so that each signature hashes only its own message.
#[derive(Clone)]
pub struct SigningKey(HmacSha256);

impl SigningKey {
    pub fn new(key: &[u8; 32]) -> SigningKey {
        SigningKey(<HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes any key length"))
    }

    /// HMAC-SHA256 of `data` with this key.
    pub fn mac(&self, data: &[u8]) -> [u8; 32] {
        let mut mac = self.0.clone();
        mac.update(data);
        mac.finalize().into_bytes().into()
    }

    /// The signature of `string_to_sign`: its HMAC as lowercase hex.
    pub fn sign(&self, string_to_sign: &str) -> String {
        hex_lower(&self.mac(string_to_sign.as_bytes()))
    }

    /// The HMAC of a request's string to sign ([`string_to_sign`]), fed
    /// piece by piece instead: a request's signature (made or checked)
    /// without the string.
    pub fn mac_request(&self, amz_date: &str, scope: &str, canonical_request: &[u8]) -> [u8; 32] {
        self.start(amz_date, scope).finish(canonical_request)
    }

    /// A request's signature begun: the first three lines of its string
    /// to sign (the algorithm, `amz_date`, `scope`) fed to the HMAC.
    pub fn start(&self, amz_date: &str, scope: &str) -> Started {
        let mut mac = self.0.clone();
        for part in [ALGORITHM, amz_date, "\n", scope, "\n"] {
            mac.update(part.as_bytes());
        }
        Started(mac)
    }
}

/// A request's signature with all of its string to sign fed but the
/// canonical request's hash ([`SigningKey::start`]). Those lines are a
/// block of SHA-256 of their own, the same for every request signed in one
/// second: [`KeyCache::start`] keeps it.
#[derive(Clone)]
pub struct Started(HmacSha256);

impl Started {
    /// The signature of the request whose canonical form is `canonical_request`.
    pub fn finish(mut self, canonical_request: &[u8]) -> [u8; 32] {
        let mut hash = [0u8; 64];
        hex_into(&Sha256::digest(canonical_request), &mut hash);
        self.0.update(&hash);
        self.0.finalize().into_bytes().into()
    }
}

/// The signing key last derived for one secret, by the scope it was derived
/// for, and the signature last begun with it, by its timestamp. A scope
/// (day, region, service) lasts a whole day, so keeping the last key saves
/// four HMACs on every request but the first of the day; a timestamp lasts
/// a second, and keeping its start saves a block of SHA-256 on the
/// requests after the first in it. Both directions use it: verifying a
/// client (`auth`), signing for the backend (`sign`).
#[derive(Default)]
pub struct KeyCache(std::sync::Mutex<Option<Last>>);

struct Last {
    scope: String,
    key: SigningKey,
    /// The signature last begun with `key`, and the timestamp it began.
    begun: Option<(String, Started)>,
}

impl KeyCache {
    /// The key for `scope`, from `derive` when it is not the last one. The
    /// lock is held for a compare and a copy, or for the derivation once a
    /// day.
    pub fn get(&self, scope: &str, derive: impl FnOnce() -> [u8; 32]) -> SigningKey {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Self::entry(&mut last, scope, derive).key.clone()
    }

    /// The signature begun for a request at `amz_date` in `scope`
    /// ([`SigningKey::start`]), the key from `derive` when it is not the
    /// last one; begun again only when the second is not the last one.
    pub fn start(&self, scope: &str, amz_date: &str, derive: impl FnOnce() -> [u8; 32]) -> Started {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let entry = Self::entry(&mut last, scope, derive);
        if let Some((date, started)) = &entry.begun
            && date == amz_date
        {
            return started.clone();
        }
        let started = entry.key.start(amz_date, scope);
        entry.begun = Some((amz_date.to_string(), started.clone()));
        started
    }

    fn entry<'a>(
        last: &'a mut Option<Last>,
        scope: &str,
        derive: impl FnOnce() -> [u8; 32],
    ) -> &'a mut Last {
        if last.as_ref().is_none_or(|l| l.scope != scope) {
            *last = Some(Last {
                scope: scope.to_string(),
                key: SigningKey::new(&derive()),
                begun: None,
            });
        }
        last.as_mut().expect("filled above")
    }
}

/// The first line of every string to sign.
const ALGORITHM: &str = "AWS4-HMAC-SHA256\n";

/// The string SigV4 signs: the algorithm, the request's timestamp, its
/// scope (`date/region/service/aws4_request`) and the hash of the canonical
/// request.
pub fn string_to_sign(amz_date: &str, scope: &str, canonical_request: &[u8]) -> String {
    let mut out = String::with_capacity(ALGORITHM.len() + amz_date.len() + scope.len() + 66);
    out.push_str(ALGORITHM);
    out.push_str(amz_date);
    out.push('\n');
    out.push_str(scope);
    out.push('\n');
    push_hex(&mut out, &Sha256::digest(canonical_request));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::sigv4::is_signature;

    /// The signature fed piece by piece is the HMAC of the string to sign,
    /// and only the right hex signature matches it.
    #[test]
    fn a_request_mac_is_the_mac_of_its_string_to_sign() {
        let key = SigningKey::new(&signing_key("secret", "20261124", "us-east-1", "s3"));
        let (date, scope) = ("20261124T010203Z", "20261124/us-east-1/s3/aws4_request");
        let canonical = b"PUT\n/b/k\n\nhost:h\n\nhost\nUNSIGNED-PAYLOAD";
        let mac = key.mac_request(date, scope, canonical);
        let hex = key.sign(&string_to_sign(date, scope, canonical));
        assert_eq!(
            mac,
            key.mac(string_to_sign(date, scope, canonical).as_bytes())
        );
        assert!(is_signature(&mac, &hex));
        let mut wrong = hex.clone().into_bytes();
        wrong[63] = if wrong[63] == b'0' { b'1' } else { b'0' };
        assert!(!is_signature(&mac, std::str::from_utf8(&wrong).unwrap()));
        assert!(!is_signature(&mac, &hex[..62]));
        assert!(!is_signature(&mac, &hex.to_uppercase()));
    }

    /// What the cache gives is what a fresh key gives, whatever the order
    /// of the scopes and seconds asked for.
    #[test]
    fn a_kept_start_is_a_fresh_one() {
        let cache = KeyCache::default();
        let canonical = b"PUT\n/b/k\n\nhost:h\n\nhost\nUNSIGNED-PAYLOAD";
        for (day, region, time) in [
            ("20261124", "us-east-1", "010203"),
            ("20261124", "us-east-1", "010203"),
            ("20261124", "us-east-1", "010204"),
            ("20261124", "eu-west-1", "010204"),
            ("20261125", "eu-west-1", "010204"),
            ("20261124", "us-east-1", "010203"),
        ] {
            let scope = format!("{day}/{region}/s3/aws4_request");
            let date = format!("{day}T{time}Z");
            let derive = || signing_key("secret", day, region, "s3");
            let fresh = SigningKey::new(&derive());
            let kept = cache.start(&scope, &date, derive).finish(canonical);
            assert_eq!(
                kept,
                fresh.mac_request(&date, &scope, canonical),
                "{scope} {date}"
            );
            assert_eq!(cache.get(&scope, derive).mac(b"x"), fresh.mac(b"x"));
        }
    }
}
