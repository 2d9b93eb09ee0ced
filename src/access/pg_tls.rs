//! TLS to PostgreSQL with libpq's `sslmode` choices, over tokio-rustls.
//!
//! tokio-postgres knows only disable, prefer and require, and verifies
//! nothing itself: the connector decides what is trusted. So the URL's
//! `sslmode`, `sslrootcert`, `sslcert` and `sslkey` are taken out here and
//! turned into a rustls config, as libpq reads them:
//!
//! | sslmode | encrypted | certificate checked | host name checked |
//! |---|---|---|---|
//! | disable | no | – | – |
//! | allow, prefer (default) | if the server offers | no | no |
//! | require | yes | only if a CA is given (libpq's rule) | no |
//! | verify-ca | yes | yes | no |
//! | verify-full | yes | yes | yes |
//!
//! SCRAM-SHA-256 works over any of them; channel binding is not offered
//! (the stream reports none), so `-PLUS` is not used.

use crate::config::access::AccessConfig;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The connector: one rustls config, and the mode it was made for.
#[derive(Clone)]
pub struct PgTls {
    config: Arc<ClientConfig>,
    mode: Mode,
}

impl PgTls {
    pub fn ssl_mode(&self) -> SslMode {
        match self.mode {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            _ => SslMode::Require,
        }
    }
}

/// Takes the TLS parameters out of `url`, and builds the connector they
/// ask for (the access table's files win over the URL's).
pub fn split_url(url: &str, access: &AccessConfig) -> Result<(String, PgTls), String> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let (mut mode, mut root, mut cert, mut key) = (None, None, None, None);
    let mut kept = Vec::new();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "sslmode" => mode = Some(v.to_string()),
            "sslrootcert" => root = Some(std::path::PathBuf::from(v)),
            "sslcert" => cert = Some(std::path::PathBuf::from(v)),
            "sslkey" => key = Some(std::path::PathBuf::from(v)),
            _ => kept.push(kv),
        }
    }
    let mode = match mode.as_deref().unwrap_or("prefer") {
        "disable" => Mode::Disable,
        "allow" | "prefer" => Mode::Prefer,
        "require" => Mode::Require,
        "verify-ca" => Mode::VerifyCa,
        "verify-full" => Mode::VerifyFull,
        other => {
            return Err(format!(
                "sslmode={other} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ));
        }
    };
    let files = AccessConfig {
        ca_file: access.ca_file.clone().or(root),
        cert_file: access.cert_file.clone().or(cert),
        tls_key_file: access.tls_key_file.clone().or(key),
        ..AccessConfig::default()
    };
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let config = client_config(mode, &files)?;
    Ok((rest, PgTls { config, mode }))
}

fn client_config(mode: Mode, files: &AccessConfig) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let ca = files.ca_pem()?;
    let lenient = |chain| -> Arc<dyn ServerCertVerifier> {
        Arc::new(Lenient {
            chain,
            provider: provider.clone(),
        })
    };
    let verifier = match (mode, &ca) {
        (Mode::Disable | Mode::Prefer, _) | (Mode::Require, None) => lenient(None),
        _ => {
            let roots = Arc::new(roots(ca.as_deref())?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| e.to_string())?;
            match mode {
                Mode::VerifyFull => webpki,
                _ => lenient(Some(webpki)),
            }
        }
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match files.identity_pem()? {
        Some((c, k)) => {
            let chain = CertificateDer::pem_slice_iter(&c)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("sslcert: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(&k).map_err(|e| format!("sslkey: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("sslcert / sslkey: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The CA's certificates, or the system's roots without one.
fn roots(ca: Option<&[u8]>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("ca_file: {e}"))?;
                roots.add(cert).map_err(|e| format!("ca_file: {e}"))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    if roots.is_empty() {
        return Err(
            "no CA certificate to verify the server with: set ca_file or sslrootcert".into(),
        );
    }
    Ok(roots)
}

/// What `prefer`, `require` and `verify-ca` check: with no chain verifier
/// (prefer, and require without a CA, as libpq), no certificate at all;
/// with one (verify-ca), the chain but not the host name. The handshake's
/// own signatures are verified either way.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// One connection's handshake: the config and the server's name.
pub struct PgTlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

/// The encrypted stream tokio-postgres reads and writes.
pub struct PgTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = rustls_pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<PgTlsConnect, Self::Error> {
        Ok(PgTlsConnect {
            config: self.config.clone(),
            name: ServerName::try_from(domain.to_string())?,
        })
    }
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<PgTlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await
                .map(PgTlsStream)
        })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_ssl_parameters_are_taken_out_of_the_url() {
        let a = AccessConfig::default();
        let (rest, tls) = split_url(
            "postgres://u@h:5432/db?sslmode=require&application_name=x",
            &a,
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@h:5432/db?application_name=x");
        assert_eq!(tls.mode, Mode::Require);
        let (rest, tls) = split_url("postgres://u@h/db", &a).unwrap();
        assert_eq!(
            (rest.as_str(), tls.mode),
            ("postgres://u@h/db", Mode::Prefer)
        );
        let e = split_url("postgres://h/db?sslmode=verify-everything", &a)
            .err()
            .unwrap();
        assert!(e.contains("sslmode=verify-everything"), "{e}");
        let e = split_url(
            "postgres://h/db?sslmode=verify-full&sslrootcert=/nonexistent.pem",
            &a,
        )
        .err()
        .unwrap();
        assert!(e.contains("/nonexistent.pem"), "{e}");
    }
}
