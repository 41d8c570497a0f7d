//! Real parts for the egress tests: a certificate authority made in the
//! test (rcgen), an HTTPS receiver, and real proxy servers (Debian's
//! tinyproxy and dante-server) started as child processes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use tokio::process::{Child, Command};

use crate::helpers::{closed_port, Receiver, PATIENCE};

/// A certificate authority of the test's own.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its key, PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn issue(&self, names: &[&str]) -> Issued {
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("server params");
        let key = KeyPair::generate().expect("server key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("signed");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Writes the CA's certificate to `dir/name` for `HERALD_CA_BUNDLE`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.pem()).expect("write CA");
        path
    }
}

impl Issued {
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write cert");
        std::fs::write(&key, &self.key_pem).expect("write key");
        (cert, key)
    }
}

/// An HTTPS receiver: the scriptable [`Receiver`] behind a TLS terminator
/// on its own port, serving `issued`.
pub struct HttpsReceiver {
    pub inner: Receiver,
    pub addr: SocketAddr,
}

impl HttpsReceiver {
    pub async fn start(issued: &Issued) -> HttpsReceiver {
        use rustls::pki_types::pem::PemObject;
        let inner = Receiver::start().await;
        let chain = rustls::pki_types::CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("cert pem");
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes())
            .expect("key pem");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let plain = inner.addr;
        // Terminates TLS and relays the bytes to the plain receiver.
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let Ok(mut backend) = tokio::net::TcpStream::connect(plain).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut backend).await;
                });
            }
        });
        HttpsReceiver { inner, addr }
    }

    /// `https://localhost:port{path}`: the name the certificate carries.
    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.addr.port())
    }
}

/// Skips (by name) when `binary` is missing, unless CI requires it.
pub fn have(binary: &str, test: &str) -> bool {
    crate::helpers::installed(&[binary], "HERALD_REQUIRE_PROXIES", test)
}

pub const TINYPROXY: &str = "/usr/bin/tinyproxy";
pub const DANTED: &str = "/usr/sbin/danted";

/// A proxy server running as a child process, with its log.
pub struct ProxyServer {
    pub port: u16,
    log: PathBuf,
    _child: Child,
    _dir: tempfile::TempDir,
}

impl ProxyServer {
    /// tinyproxy (HTTP, CONNECT) on a free port, requiring `user:pass`.
    pub async fn tinyproxy(user: &str, pass: &str) -> ProxyServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = closed_port().await;
        let log = dir.path().join("proxy.log");
        let conf = dir.path().join("tinyproxy.conf");
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 30\nLogFile \"{}\"\nLogLevel Connect\n\
                 MaxClients 64\nAllow 127.0.0.1\nBasicAuth {user} {pass}\n",
                log.display()
            ),
        )
        .expect("conf");
        let child = Command::new(TINYPROXY)
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("tinyproxy starts");
        ProxyServer::ready(port, log, child, dir).await
    }

    /// dante-server (SOCKS5, no authentication) on a free port.
    pub async fn dante() -> ProxyServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = closed_port().await;
        let log = dir.path().join("proxy.log");
        let conf = dir.path().join("danted.conf");
        std::fs::write(
            &conf,
            format!(
                "logoutput: {}\ninternal: 127.0.0.1 port = {port}\nexternal: 127.0.0.1\n\
                 socksmethod: none\nclientmethod: none\nuser.privileged: root\n\
                 user.unprivileged: nobody\n\
                 client pass {{ from: 127.0.0.0/8 to: 0.0.0.0/0 log: connect }}\n\
                 socks pass {{ from: 127.0.0.0/8 to: 0.0.0.0/0 log: connect }}\n",
                log.display()
            ),
        )
        .expect("conf");
        let child = Command::new(DANTED)
            .arg("-f")
            .arg(&conf)
            .arg("-N")
            .arg("1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("danted starts");
        ProxyServer::ready(port, log, child, dir).await
    }

    async fn ready(port: u16, log: PathBuf, child: Child, dir: tempfile::TempDir) -> ProxyServer {
        let deadline = Instant::now() + PATIENCE;
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "the proxy never listened on {port}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ProxyServer {
            port,
            log,
            _child: child,
            _dir: dir,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) until the log holds `needle`.
    pub async fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "the proxy's log never showed {needle:?}:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
