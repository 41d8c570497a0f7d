//! The listener's HTTPS (`HERALD_TLS_CERT`, `HERALD_TLS_KEY`): rustls with
//! the certificate chain and key read from PEM files, read again on SIGHUP
//! so a renewed certificate needs no restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// What a load or reload failed on, naming the file and the setting.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("HERALD_TLS_CERT: cannot read a certificate chain from {path}: {message}")]
    Cert { path: PathBuf, message: String },
    #[error("HERALD_TLS_KEY: cannot read a private key from {path}: {message}")]
    Key { path: PathBuf, message: String },
    #[error("HERALD_TLS_CERT/HERALD_TLS_KEY: {0}")]
    Config(String),
}

/// The certificate in use, and where to read it again.
pub struct ListenerTls {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<ServerConfig>>,
}

impl ListenerTls {
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        Ok(Arc::new(ListenerTls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(Arc::new(server_config(cert, key)?)),
        }))
    }

    /// For one connection's handshake: the certificate loaded last.
    pub fn acceptor(&self) -> TlsAcceptor {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        TlsAcceptor::from(current.clone())
    }

    /// Reads the files again; on failure the certificate in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = Arc::new(server_config(&self.cert, &self.key)?);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    /// Reloads on every SIGHUP until `shutdown`.
    pub async fn reload_on_hangup(self: Arc<Self>, shutdown: CancellationToken) {
        on_each_hangup(shutdown, || match self.reload() {
            Ok(()) => tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded"),
            Err(e) => {
                tracing::error!(error = %e, "TLS certificate not reloaded; the previous one stays in use")
            }
        })
        .await;
    }
}

/// Calls `action` on every SIGHUP until `shutdown`. While it runs, SIGHUP
/// no longer has its default action (ending the process at once).
pub async fn on_each_hangup(shutdown: CancellationToken, mut action: impl FnMut()) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGHUP: it would end the process");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            got = hangups.recv() => if got.is_none() { return },
        }
        action();
    }
}

/// A PEM file's fault in words: rustls shows the marker it looked for as
/// a list of byte values (`missing section end marker: [45, 45, …]`).
pub fn pem_fault(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::MissingSectionEnd { end_marker } => format!(
            "a block is not closed: no `-----END {}-----` line",
            String::from_utf8_lossy(end_marker).trim()
        ),
        Error::IllegalSectionStart { line } => format!(
            "a block's first line is malformed: `{}`",
            String::from_utf8_lossy(line).trim()
        ),
        Error::Base64Decode(why) => format!("a block is not valid base64 ({why})"),
        Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// Every certificate in a PEM text (`HERALD_TLS_CERT`, `HERALD_CA_BUNDLE`).
pub fn certificates_in(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_fault(&e))?;
    if chain.is_empty() {
        return Err("no CERTIFICATE block".into());
    }
    Ok(chain)
}

fn server_config(cert: &Path, key: &Path) -> Result<ServerConfig, TlsError> {
    let chain = std::fs::read(cert)
        .map_err(|e| e.to_string())
        .and_then(|pem| certificates_in(&pem))
        .map_err(|message| TlsError::Cert {
            path: cert.to_owned(),
            message,
        })?;
    let private_key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.to_owned(),
        message: match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block".into()
            }
            e => pem_fault(&e),
        },
    })?;
    // The provider is named: with more than one compiled in (other crates
    // bring aws-lc-rs), rustls would not pick one by itself.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, private_key)
        .map_err(|e| TlsError::Config(format!("the key does not fit the certificate: {e}")))?;
    // The listener speaks HTTP/1.1 only (see server::serve).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_faults_are_said_in_words() {
        let unclosed = b"-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n";
        let err = certificates_in(unclosed).expect_err("unclosed");
        assert_eq!(
            err,
            "a block is not closed: no `-----END CERTIFICATE-----` line"
        );
        assert_eq!(
            certificates_in(b"just text\n").expect_err("empty"),
            "no CERTIFICATE block"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert, unclosed).expect("write");
        std::fs::write(&key, "no key here\n").expect("write");
        let err = server_config(&cert, &key).expect_err("refused").to_string();
        assert!(err.starts_with("HERALD_TLS_CERT: "), "{err}");
        assert!(err.contains("no `-----END CERTIFICATE-----` line"), "{err}");
        assert!(!err.contains("[45, 45"), "{err}");
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
        std::fs::write(&cert, made.cert.pem()).expect("write");
        let err = server_config(&cert, &key).expect_err("no key").to_string();
        assert!(
            err.ends_with("no PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block"),
            "{err}"
        );
        std::fs::write(&key, made.key_pair.serialize_pem()).expect("write");
        assert!(server_config(&cert, &key).is_ok());
    }
}
