//! TLS with rustls (ring provider): the front listener's certificate, and the
//! trust roots for an `https://` backend (the system's, plus an optional CA
//! file).

use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{field}: cannot read {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{field}: {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{field}: no certificate in {}", path.display()));
    }
    Ok(certs)
}

/// The front listener's TLS config from PEM files.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let chain = certs(cert, "server.tls_cert")?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("server.tls_key: {}: {e}", key.display()))?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("server.tls_cert / server.tls_key: {e}"))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Trust for the backend: the system roots, plus `extra_ca` if given.
pub fn client_config(extra_ca: Option<&Path>) -> Result<ClientConfig, String> {
    client_config_named(extra_ca, "backend.ca_file")
}

/// [`client_config`], its errors naming the setting `setting`.
pub fn client_config_named(extra_ca: Option<&Path>, setting: &str) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = extra_ca {
        for cert in certs(path, setting)? {
            roots.add(cert).map_err(|e| format!("{setting}: {e}"))?;
        }
    }
    if roots.is_empty() {
        return Err(format!(
            "no trusted root certificates: install the system CA bundle or set {setting}"
        ));
    }
    client_trusting(roots)
}

fn client_trusting(roots: RootCertStore) -> Result<ClientConfig, String> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A client config for plain-HTTP backends (never used for a handshake).
pub fn client_config_without_roots() -> Result<ClientConfig, String> {
    client_trusting(RootCertStore::empty())
}

/// A client config that trusts only the certificates in `ca` (PEM).
pub fn client_config_with(ca: &Path) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    for cert in certs(ca, "ca")? {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    client_trusting(roots)
}
