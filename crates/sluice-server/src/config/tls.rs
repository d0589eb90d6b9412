//! `[server.tls]` and `upstream_ca`: the PEM files read, checked and turned into rustls
//! configs when the configuration is loaded (by `serve`, `check-config` and every SIGHUP), so
//! that a missing file, a bad PEM or a key that does not match its certificate is an error of
//! the configuration, naming the field and the file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sluice_http::proxy::{pem_certificates, provider};

/// `[server.tls]`: the listener's certificate chain and key, loaded.
#[derive(Clone)]
pub struct ServerTls {
    /// `cert`.
    pub cert: PathBuf,
    /// `key`.
    pub key: PathBuf,
    /// The rustls config: TLS 1.2 and 1.3, ALPN `h2` then `http/1.1`.
    pub config: Arc<rustls::ServerConfig>,
    /// The certificate chain as read, to tell a changed file at reload.
    chain: Vec<CertificateDer<'static>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ServerTls {
    /// The same files holding the same certificates (the key goes with them).
    fn eq(&self, other: &ServerTls) -> bool {
        self.cert == other.cert && self.key == other.key && self.chain == other.chain
    }
}

/// What is wrong with `[server.tls]`: the field (`cert` or `key`) and the message.
pub type TlsProblem = (&'static str, String);

impl ServerTls {
    /// Reads `cert` and `key` and makes the listener's rustls config.
    ///
    /// # Errors
    ///
    /// The field at fault and what is wrong, naming the file: unreadable, not PEM, no
    /// certificate or no private key in it, or a key that is not the certificate's.
    pub fn load(cert: &Path, key: &Path) -> Result<ServerTls, TlsProblem> {
        let cert_pem = std::fs::read(cert)
            .map_err(|e| ("cert", format!("cannot read `{}`: {e}", cert.display())))?;
        let chain = pem_certificates(&cert_pem)
            .map_err(|e| ("cert", format!("`{}`: {e}", cert.display())))?;
        if chain.is_empty() {
            return Err((
                "cert",
                format!(
                    "`{}` holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                    cert.display()
                ),
            ));
        }
        let key_pem = std::fs::read(key)
            .map_err(|e| ("key", format!("cannot read `{}`: {e}", key.display())))?;
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            (
                "key",
                format!(
                    "`{}` holds no usable PEM private key (PKCS#8, RSA or EC): {e}",
                    key.display()
                ),
            )
        })?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| ("cert", e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain.clone(), private)
            .map_err(|e| {
                let why = match e {
                    rustls::Error::InconsistentKeys(_) => "is not the key of".to_owned(),
                    other => format!("cannot be used with ({other})"),
                };
                (
                    "key",
                    format!(
                        "`{}` {why} the certificate in `{}`",
                        key.display(),
                        cert.display()
                    ),
                )
            })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            config: Arc::new(config),
            chain,
        })
    }
}

/// `route.upstream_ca`: the CA certificates an `https://` upstream is verified against.
#[derive(Clone, PartialEq)]
pub struct UpstreamCa {
    /// The file.
    pub path: PathBuf,
    /// Its certificates.
    pub certs: Vec<CertificateDer<'static>>,
}

impl std::fmt::Debug for UpstreamCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UpstreamCa({})", self.path.display())
    }
}

impl UpstreamCa {
    /// Reads the CA certificates of `path`.
    ///
    /// # Errors
    ///
    /// What is wrong, naming the file: unreadable, not PEM, no certificate, or one rustls
    /// cannot use as a root.
    pub fn load(path: &Path) -> Result<UpstreamCa, String> {
        let pem =
            std::fs::read(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
        let certs = pem_certificates(&pem).map_err(|e| format!("`{}`: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "`{}` holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            ));
        }
        sluice_http::proxy::client_config(Some(&certs))
            .map_err(|e| format!("`{}`: {e}", path.display()))?;
        Ok(UpstreamCa {
            path: path.to_owned(),
            certs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_non_pem_file_is_named() {
        let dir = std::env::temp_dir().join(format!("sluice-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "hello").unwrap();
        let missing = dir.join("missing.pem");
        let (field, message) = ServerTls::load(&missing, &junk).unwrap_err();
        assert_eq!(field, "cert");
        assert!(message.contains("missing.pem"), "{message}");
        let (field, message) = ServerTls::load(&junk, &junk).unwrap_err();
        assert_eq!(field, "cert");
        assert!(message.contains("holds no PEM certificate"), "{message}");
        assert!(UpstreamCa::load(&junk).unwrap_err().contains("junk.pem"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
