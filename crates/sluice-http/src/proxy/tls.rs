//! TLS to `https://` upstreams: rustls with the ring provider, TLS 1.2 and 1.3, verified
//! against the system's trust store or a CA of the route's own (`upstream_ca`).

use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

/// A trust store that could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// The CA file holds no certificate, or one rustls refuses.
    #[error("{0}")]
    Roots(String),
}

/// The rustls provider every TLS config of sluice uses: ring (pure Rust and assembly, no
/// OpenSSL or aws-lc to build).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: OnceLock<Arc<rustls::crypto::CryptoProvider>> = OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}

/// The certificates of a PEM document (`CERTIFICATE` blocks; anything else is skipped).
///
/// # Errors
///
/// A block that is not valid PEM.
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate file: {e}"))
}

/// A client config that trusts `roots` (the route's `upstream_ca`), or the system's trust
/// store when `None` (read once per process).
///
/// # Errors
///
/// [`TlsError::Roots`] when no root can be used.
pub fn client_config(
    roots: Option<&[CertificateDer<'static>]>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let store = match roots {
        Some(certs) => {
            let mut store = RootCertStore::empty();
            for cert in certs {
                store
                    .add(cert.clone())
                    .map_err(|e| TlsError::Roots(format!("a CA certificate is refused: {e}")))?;
            }
            if store.is_empty() {
                return Err(TlsError::Roots("no CA certificate in the file".to_owned()));
            }
            Arc::new(store)
        }
        None => system_roots()?,
    };
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Roots(e.to_string()))?
        .with_root_certificates(store)
        .with_no_client_auth();
    // The upstream connection speaks HTTP/1.1 (pooled, as plain http:// upstreams).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The system's trust store (`rustls-native-certs`: on Linux the distribution's CA bundle, or
/// `SSL_CERT_FILE` / `SSL_CERT_DIR`), read once per process.
fn system_roots() -> Result<Arc<RootCertStore>, TlsError> {
    static ROOTS: OnceLock<Result<Arc<RootCertStore>, TlsError>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut store = RootCertStore::empty();
            let (added, _ignored) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map_or_else(|| "none found".to_owned(), ToString::to_string);
                return Err(TlsError::Roots(format!(
                    "no system root certificate could be loaded ({why}); give the route an upstream_ca"
                )));
            }
            Ok(Arc::new(store))
        })
        .clone()
}
