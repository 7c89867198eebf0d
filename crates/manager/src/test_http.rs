//! A minimal HTTP/1.1 client for this crate's tests (plain or over any stream).

use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub(crate) struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub(crate) async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    get_over(stream, path, headers).await
}

pub(crate) async fn get_over<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    path: &str,
    headers: &[(&str, &str)],
) -> Response {
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    // TLS peers may close without close_notify; keep what was read.
    let _ = stream.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// TLS client that accepts any server certificate (tests use self-signed ones).
pub(crate) mod tls {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use rustls::DigitallySignedStruct;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    use super::{Response, get_over};

    #[derive(Debug)]
    struct AcceptAny(Arc<CryptoProvider>);

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    /// A TLS connection to `addr`, handshake done.
    pub(crate) async fn connect(
        addr: SocketAddr,
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        connector.connect(name, tcp).await.unwrap()
    }

    /// GET over TLS; returns the response and the certificate the server presented.
    pub(crate) async fn get(
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (Response, CertificateDer<'static>) {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let stream = connector.connect(name, tcp).await.unwrap();
        let cert = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
        (get_over(stream, path, headers).await, cert)
    }
}

/// Opens `n` connections to `addr` that never finish a request: every other one sends
/// nothing, the others half a request line (a slowloris client).
pub(crate) async fn stalled(addr: SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut conns = Vec::new();
    for i in 0..n {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        if i % 2 == 1 {
            // The server may already have given up on it: a failed write is fine.
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: loc").await;
        }
        conns.push(s);
    }
    conns
}

/// How many of `conns` the server closes (end of stream or reset) within `within`.
pub(crate) async fn closed_by_server<S: AsyncRead + Unpin>(
    conns: Vec<S>,
    within: std::time::Duration,
) -> usize {
    let waits = conns.into_iter().map(|mut s| async move {
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    });
    let deadline = tokio::time::Instant::now() + within;
    let results = futures::future::join_all(
        waits.map(|w| async move { tokio::time::timeout_at(deadline, w).await.is_ok() }),
    )
    .await;
    results.into_iter().filter(|closed| *closed).count()
}
