//! TLS with rustls (the `ring` provider; no OpenSSL anywhere).
//!
//! - Clients: `tether daemon` and `tether attach` dial `https://` and
//!   `wss://` trusting the system's roots plus an optional `--ca-file`
//!   ([`http_client`]). ALPN offers only HTTP/1.1, because a WebSocket
//!   upgrade needs it. Their sockets set TCP_NODELAY ([`NoDelay`]): a
//!   keystroke or an echo is one small write, and Nagle's algorithm would
//!   hold it behind an unacknowledged one (awc's connector leaves it on).
//! - Server: `tether serve` terminates TLS itself when `http.tls_cert_path`
//!   and `http.tls_key_path` are set ([`server_config`]).
//! - [`explain`] turns a failed handshake into a message that names the
//!   problem (unknown CA, expired certificate, wrong host name), since
//!   awc's errors reach users only as text.
//!
//! docs/CONFIG.md ("TLS") documents the settings and flags.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix_rt::net::TcpStream;
use actix_tls::connect::{ConnectError, ConnectInfo, Connection, ConnectorService};
use actix_web::dev::Service;
use awc::http::Uri;
use futures_util::future::LocalBoxFuture;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate, key or CA file that cannot be used, or a configuration
/// rustls refuses.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {message}")]
    File { what: &'static str, path: PathBuf, message: String },
    #[error("{what} {path} holds no PEM certificate")]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("{what} {path}: {message}")]
    Unusable { what: &'static str, path: PathBuf, message: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file (at least one).
fn read_certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |message: String| TlsError::File { what, path: path.to_path_buf(), message };
    // Reading first gives "No such file" rather than a PEM parser's wording.
    let pem = std::fs::read(path).map_err(|e| file_error(e.to_string()))?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Unusable { what, path: path.to_path_buf(), message: format!("bad PEM: {e}") })?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate { what, path: path.to_path_buf() });
    }
    Ok(certificates)
}

/// The roots a client trusts: the system's store (what `ca-certificates`
/// installs) plus every certificate in `ca_file`.
fn root_store(ca_file: Option<&Path>) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    let system = rustls_native_certs::load_native_certs();
    for error in &system.errors {
        // A missing or partly unreadable system store must not stop a daemon
        // that brings its own CA.
        tracing::debug!(error = %error, "tether_tls_system_roots_partly_unreadable");
    }
    let (added, _ignored) = roots.add_parsable_certificates(system.certs);
    if let Some(path) = ca_file {
        for certificate in read_certificates("CA file", path)? {
            roots.add(certificate).map_err(|e| TlsError::Unusable {
                what: "CA file",
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        }
    }
    if roots.is_empty() {
        tracing::warn!(
            "tether_tls_no_trusted_roots: no system roots found and no --ca-file; https:// servers will be refused"
        );
    }
    tracing::debug!(system_roots = added, ca_file = ?ca_file, "tether_tls_roots_loaded");
    Ok(roots)
}

/// The rustls client configuration for `https://`/`wss://`.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let roots = root_store(ca_file)?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // A WebSocket upgrade is an HTTP/1.1 exchange.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// An awc client that speaks `http://` and, with the roots above,
/// `https://`, over sockets with TCP_NODELAY.
pub fn http_client(ca_file: Option<&Path>, timeout: Duration) -> Result<awc::Client, TlsError> {
    let connector = awc::Connector::new().connector(NoDelay::default()).rustls_0_23(client_config(ca_file)?);
    Ok(awc::Client::builder().connector(connector).timeout(timeout).finish())
}

/// awc's TCP connector (actix-tls's, with its default resolver) that sets
/// TCP_NODELAY on every socket it opens, before TLS or HTTP use it.
#[derive(Clone, Default)]
pub struct NoDelay(ConnectorService);

impl Service<ConnectInfo<Uri>> for NoDelay {
    type Response = Connection<Uri, TcpStream>;
    type Error = ConnectError;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        Service::<ConnectInfo<Uri>>::poll_ready(&self.0, cx)
    }

    fn call(&self, req: ConnectInfo<Uri>) -> Self::Future {
        let connecting = self.0.call(req);
        Box::pin(async move {
            let connection = connecting.await?;
            connection.io_ref().set_nodelay(true).map_err(ConnectError::Io)?;
            Ok(connection)
        })
    }
}

/// The rustls server configuration from a PEM certificate chain and key.
pub fn server_config(cert_path: &Path, key_path: &Path) -> Result<rustls::ServerConfig, TlsError> {
    let chain = read_certificates("certificate file", cert_path)?;
    let pem = std::fs::read(key_path).map_err(|e| TlsError::File {
        what: "key file",
        path: key_path.to_path_buf(),
        message: e.to_string(),
    })?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Unusable {
        what: "key file",
        path: key_path.to_path_buf(),
        message: format!("no usable PEM private key: {e}"),
    })?;
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Unusable {
            what: "certificate and key",
            path: cert_path.to_path_buf(),
            message: format!("do not form a usable pair: {e}"),
        })
}

/// A connection error as text, with a plain statement of the TLS problem
/// first when there is one ("the server's certificate has expired"), so a
/// log line or an error message says what to fix.
pub fn explain(error: &dyn std::fmt::Display) -> String {
    let raw = error.to_string();
    match certificate_problem(&raw) {
        Some(problem) => format!("TLS: {problem} ({raw})"),
        None => raw,
    }
}

/// Whether `explain`'s text names a certificate problem: retrying the same
/// connection cannot fix it.
pub fn is_certificate_problem(message: &str) -> bool {
    message.starts_with("TLS: the server's certificate")
}

/// rustls reports certificate problems through io errors that awc keeps
/// only as text; these are rustls' own wordings (`rustls::CertificateError`).
fn certificate_problem(raw: &str) -> Option<&'static str> {
    if !raw.contains("invalid peer certificate") {
        return None;
    }
    let problem = if raw.contains("UnknownIssuer") {
        "the server's certificate is not signed by a trusted certificate authority \
         (pass the CA that signed it with --ca-file)"
    } else if raw.contains("expired") || raw.contains("Expired") {
        "the server's certificate has expired"
    } else if raw.contains("not valid yet") || raw.contains("NotValidYet") {
        "the server's certificate is not valid yet (check the clocks)"
    } else if raw.contains("not valid for name") || raw.contains("NotValidForName") {
        "the server's certificate is not valid for this host name"
    } else if raw.contains("Revoked") {
        "the server's certificate has been revoked"
    } else {
        "the server's certificate was refused"
    };
    Some(problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_certificate_problem() {
        let unknown = explain(&"Failed to connect to host: invalid peer certificate: UnknownIssuer");
        assert!(unknown.starts_with("TLS: the server's certificate is not signed by a trusted"), "{unknown}");
        assert!(is_certificate_problem(&unknown));
        let expired = explain(
            &"invalid peer certificate: certificate expired: verification time 1764000000 (UNIX), \
              but certificate is not valid after 1700000000 (64000000 seconds ago)",
        );
        assert!(expired.contains("the server's certificate has expired"), "{expired}");
        let name = explain(&"invalid peer certificate: NotValidForName");
        assert!(name.contains("not valid for this host name"), "{name}");
        let refused = explain(&"Connection refused (os error 111)");
        assert_eq!(refused, "Connection refused (os error 111)");
        assert!(!is_certificate_problem(&refused));
    }

    /// awc's own connector leaves Nagle's algorithm on; the clients' one
    /// turns it off.
    #[actix_rt::test]
    async fn client_sockets_set_nodelay() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let uri: Uri = format!("http://{}/", listener.local_addr().unwrap()).parse().unwrap();
        let plain = ConnectorService::default().call(ConnectInfo::new(uri.clone())).await.expect("connect");
        assert!(!plain.io_ref().nodelay().unwrap(), "the default leaves Nagle on");
        let ours = NoDelay::default().call(ConnectInfo::new(uri)).await.expect("connect");
        assert!(ours.io_ref().nodelay().unwrap());
    }

    #[test]
    fn missing_files_are_named() {
        let err = client_config(Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        assert!(err.to_string().contains("CA file /nonexistent/ca.pem"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = client_config(Some(&empty)).unwrap_err();
        assert!(err.to_string().contains("holds no PEM certificate"), "{err}");
        let err = server_config(&empty, &empty).unwrap_err();
        assert!(err.to_string().contains("certificate file"), "{err}");
    }
}
