//! TLS on the coordinator's port, accepted here rather than inside tonic so that a failed
//! handshake is seen: each is classified ([`classify`]), counted and logged through the
//! [`Audit`], and only finished TLS streams reach the gRPC server (tonic's `Connected` for
//! them keeps the peer's address and certificates on every request, which the guards
//! read).
//!
//! A plain-text HTTP/2 client (the first bytes are HTTP/2's preface, not a TLS record) is
//! answered in its own protocol: a GOAWAY with `INADEQUATE_SECURITY` and a line saying the
//! port speaks TLS, so the client reads a cause instead of a broken pipe. A connection
//! that closes before sending a byte (a TCP probe, a port scan's connect) is nobody's
//! refusal and is not recorded.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, CertificateError, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use crate::audit::{Audit, Refusal};
use crate::error::{CoordinatorError, Result};
use crate::security::ServerTls;

/// How long a client has to finish its handshake (a stalled one holds a task and a socket).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The first byte of a TLS handshake record (a ClientHello).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// What every HTTP/2 client sends first.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The debug text of the GOAWAY a plain-text HTTP/2 client gets.
const PLAIN_TEXT_ANSWER: &[u8] =
    b"this port speaks TLS: dial it with https:// (and --tls-ca), not http://";

/// The rustls configuration of `tls`: its certificate, HTTP/2 by ALPN, and with a client
/// CA, client certificates checked against it (optional at the handshake: job clients
/// have none; the cluster API's guard requires one).
pub(crate) fn server_config(tls: &ServerTls) -> Result<Arc<ServerConfig>> {
    let bad = |what: &str, e: &dyn std::fmt::Display| CoordinatorError::Tls(format!("{what}: {e}"));
    let certs = CertificateDer::pem_slice_iter(&tls.cert_pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad("the certificate", &e))?;
    let key = PrivateKeyDer::from_pem_slice(&tls.key_pem).map_err(|e| bad("the key", &e))?;
    let builder = ServerConfig::builder();
    let builder = match &tls.client_ca_pem {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                roots
                    .add(cert.map_err(|e| bad("the client CA", &e))?)
                    .map_err(|e| bad("the client CA", &e))?;
            }
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                .allow_unauthenticated()
                .build()
                .map_err(|e| bad("the client CA", &e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| bad("the certificate and key", &e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The TLS streams of the connections `listener` accepts, for tonic's
/// `serve_with_incoming`; failed handshakes go to `audit`. The listener closes when the
/// stream is dropped (the server stopped).
pub(crate) fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    audit: Arc<Audit>,
) -> ReceiverStream<io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::warn!("cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (tx, acceptor, audit) = (tx.clone(), acceptor.clone(), Arc::clone(&audit));
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tcp, &acceptor));
                let outcome = match handshake.await {
                    Ok(outcome) => outcome,
                    Err(_) => Handshake::Refused(
                        Refusal::HandshakeTimeout,
                        format!("no TLS handshake within {} s", HANDSHAKE_TIMEOUT.as_secs()),
                    ),
                };
                match outcome {
                    Handshake::Done(stream) => {
                        let _ = tx.send(Ok(*stream)).await;
                    }
                    Handshake::Refused(reason, detail) => {
                        audit.refused(role_of(reason), Some(peer), reason, &detail);
                    }
                    Handshake::Alerted(reason, detail, tcp) => {
                        audit.refused(role_of(reason), Some(peer), reason, &detail);
                        linger(tcp).await;
                    }
                    Handshake::PlainHttp2(tcp) => {
                        let reason = Refusal::PlainTextOnTls;
                        let detail = "plain-text HTTP/2 on the TLS port (told so with a GOAWAY)";
                        audit.refused(role_of(reason), Some(peer), reason, detail);
                        answer_plain_http2(tcp).await;
                    }
                    Handshake::Silent => {}
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// How a connection's handshake ended.
enum Handshake {
    Done(Box<TlsStream<TcpStream>>),
    Refused(Refusal, String),
    /// Refused by rustls, which sent the client an alert saying why: the connection is
    /// closed with [`linger`] so the client reads it.
    Alerted(Refusal, String, TcpStream),
    /// A plain-text HTTP/2 client, to be told that the port speaks TLS.
    PlainHttp2(TcpStream),
    /// Closed before a byte: a TCP probe, not a caller.
    Silent,
}

async fn handshake(tcp: TcpStream, acceptor: &tokio_rustls::TlsAcceptor) -> Handshake {
    let mut first = [0u8; HTTP2_PREFACE.len()];
    let seen = match tcp.peek(&mut first).await {
        Ok(0) => return Handshake::Silent,
        Ok(n) => n,
        Err(e) => return Handshake::Refused(Refusal::TlsHandshake, e.to_string()),
    };
    if first[0] != TLS_HANDSHAKE_RECORD {
        // The whole preface may not have arrived yet; its start is enough to tell.
        if HTTP2_PREFACE.starts_with(&first[..seen]) {
            return Handshake::PlainHttp2(tcp);
        }
        return Handshake::Refused(
            Refusal::PlainTextOnTls,
            "plain text (not a TLS record) on the TLS port".into(),
        );
    }
    match acceptor.accept(tcp).into_fallible().await {
        Ok(stream) => Handshake::Done(Box::new(stream)),
        Err((e, tcp)) => {
            let tls = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>());
            let (reason, detail) = classify(tls, &e);
            Handshake::Alerted(reason, detail, tcp)
        }
    }
}

/// How long a refused client has to read its alert and close.
const LINGER: Duration = Duration::from_secs(2);

/// Closes a connection whose last bytes (a TLS alert) the client must read: the write side
/// first, then what the client still sends is read and dropped until it closes (at most
/// [`LINGER`]). In TLS 1.3 a client's certificate is checked after the client finished
/// its half of the handshake, so the client is already sending its first request when the
/// alert goes out; closing with those bytes unread would reset the connection, and a
/// reset discards the alert before the client reads it ("broken pipe", "connection
/// closed" instead of the cause).
async fn linger(mut tcp: TcpStream) {
    let _ = tcp.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async { while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// Why a handshake failed, and what to log: from the rustls error inside `e`, if any.
pub(crate) fn classify(tls: Option<&rustls::Error>, e: &io::Error) -> (Refusal, String) {
    let reason = match tls {
        Some(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        )) => Refusal::UnknownIssuer,
        Some(rustls::Error::InvalidCertificate(_)) => Refusal::BadClientCertificate,
        Some(rustls::Error::NoCertificatesPresented) => Refusal::NoClientCertificate,
        Some(rustls::Error::AlertReceived(alert))
            if pipewise_proto::auth::refuses_certificate(*alert) =>
        {
            Refusal::ServerCertificateRefused
        }
        _ => Refusal::TlsHandshake,
    };
    let detail = match reason {
        Refusal::UnknownIssuer => format!(
            "the client's certificate is not signed by --tls-client-ca ({})",
            tls.map_or_else(|| e.to_string(), ToString::to_string)
        ),
        Refusal::ServerCertificateRefused => format!(
            "the client refused the coordinator's certificate (does its --tls-ca hold the CA \
             that signed --tls-cert, and does the certificate name the host it dials?): {e}"
        ),
        Refusal::TlsHandshake if e.kind() == io::ErrorKind::UnexpectedEof => {
            "the client closed the connection during the TLS handshake".into()
        }
        _ => format!("TLS handshake failed: {e}"),
    };
    (reason, detail)
}

/// Which role a handshake's refusal is put down to: only a client certificate says (the
/// API a caller wants comes after the handshake).
fn role_of(reason: Refusal) -> &'static str {
    match reason {
        Refusal::UnknownIssuer | Refusal::BadClientCertificate => "worker",
        _ => "unknown",
    }
}

/// Tells a plain-text HTTP/2 client that the port speaks TLS: an empty SETTINGS frame (the
/// server's preface) and a GOAWAY with `INADEQUATE_SECURITY` and [`PLAIN_TEXT_ANSWER`],
/// then reads what it sends until it closes (closing with unread bytes would reset the
/// connection, and the client might lose the answer).
///
/// The GOAWAY waits for the client's first request (a HEADERS frame), at most
/// [`REQUEST_WAIT`]: a client gives a GOAWAY's reason only to the requests it refuses, and
/// one that came before any request ends the connection quietly ("operation was canceled").
async fn answer_plain_http2(mut tcp: TcpStream) {
    let mut sink = [0u8; 4096];
    let mut seen = Vec::new();
    let until_request = async {
        while !holds_request(&seen) && seen.len() < MAX_PLAIN_READ {
            match tcp.read(&mut sink).await {
                Ok(n) if n > 0 => seen.extend_from_slice(&sink[..n]),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(REQUEST_WAIT, until_request).await;
    let _ = tcp.write_all(&goaway_frames()).await;
    linger(tcp).await;
}

/// How long a plain-text client's first request is waited for.
const REQUEST_WAIT: Duration = Duration::from_secs(2);
/// The most bytes of a plain-text client read while waiting for its request.
const MAX_PLAIN_READ: usize = 1 << 16;

/// Whether `bytes` (from the start of a plain-text HTTP/2 connection) hold a whole HEADERS
/// frame's header: the preface, then frames of a 9-byte header (24-bit length, type) and
/// their payload.
fn holds_request(bytes: &[u8]) -> bool {
    const HEADERS: u8 = 0x1;
    let mut at = HTTP2_PREFACE.len();
    while let Some(header) = bytes.get(at..at + 9) {
        if header[3] == HEADERS {
            return true;
        }
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        at += 9 + len;
    }
    false
}

/// SETTINGS (empty) and GOAWAY (last stream 0, `INADEQUATE_SECURITY`, the answer), framed.
fn goaway_frames() -> Vec<u8> {
    const SETTINGS: u8 = 0x4;
    const GOAWAY: u8 = 0x7;
    const INADEQUATE_SECURITY: u32 = 0xc;
    let frame = |kind: u8, payload: &[u8]| {
        let len = u32::try_from(payload.len()).unwrap_or(0).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, 0, 0, 0, 0, 0];
        f.extend_from_slice(payload);
        f
    };
    let mut goaway = Vec::with_capacity(8 + PLAIN_TEXT_ANSWER.len());
    goaway.extend_from_slice(&0u32.to_be_bytes());
    goaway.extend_from_slice(&INADEQUATE_SECURITY.to_be_bytes());
    goaway.extend_from_slice(PLAIN_TEXT_ANSWER);
    let mut out = frame(SETTINGS, &[]);
    out.extend(frame(GOAWAY, &goaway));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io_error(e: rustls::Error) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn rustls_errors_name_the_refusal() {
        for (error, reason) in [
            (
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
                Refusal::UnknownIssuer,
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::BadSignature),
                Refusal::UnknownIssuer,
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::Expired),
                Refusal::BadClientCertificate,
            ),
            (
                rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA),
                Refusal::ServerCertificateRefused,
            ),
            (
                rustls::Error::AlertReceived(rustls::AlertDescription::ProtocolVersion),
                Refusal::TlsHandshake,
            ),
            (rustls::Error::HandshakeNotComplete, Refusal::TlsHandshake),
        ] {
            let e = io_error(error.clone());
            let tls = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>());
            assert_eq!(classify(tls, &e).0, reason, "{error:?}");
        }
        let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
        let (reason, detail) = classify(None, &eof);
        assert_eq!(reason, Refusal::TlsHandshake);
        assert!(detail.contains("closed the connection"), "{detail}");
        assert_eq!(role_of(Refusal::UnknownIssuer), "worker");
    }

    /// A coordinator certificate (self-signed) and the acceptor of the port.
    fn acceptor() -> tokio_rustls::TlsAcceptor {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
        let tls = ServerTls {
            cert_pem: cert.cert.pem().into_bytes(),
            key_pem: cert.signing_key.serialize_pem().into_bytes(),
            client_ca_pem: None,
        };
        tokio_rustls::TlsAcceptor::from(server_config(&tls).expect("config"))
    }

    /// The outcome of the handshake of a client that sends `sent` (and closes when it is
    /// `None`), and what the client read back.
    async fn outcome_of(sent: Option<&'static [u8]>) -> (&'static str, Vec<u8>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = tokio::spawn(async move {
            let mut tcp = TcpStream::connect(addr).await.expect("connect");
            let mut answer = Vec::new();
            if let Some(bytes) = sent {
                tcp.write_all(bytes).await.expect("write");
                let _ = tcp.read_to_end(&mut answer).await;
            }
            answer
        });
        let (tcp, _) = listener.accept().await.expect("accept");
        let acceptor = acceptor();
        let handshake = tokio::time::timeout(Duration::from_secs(5), handshake(tcp, &acceptor));
        let outcome = match handshake.await.expect("a handshake's end within 5 s") {
            Handshake::Done(_) => "done",
            Handshake::Refused(Refusal::PlainTextOnTls, _) => "plain text",
            Handshake::Refused(..) | Handshake::Alerted(..) => "refused",
            Handshake::PlainHttp2(tcp) => {
                answer_plain_http2(tcp).await;
                "plain HTTP/2"
            }
            Handshake::Silent => "silent",
        };
        (outcome, client.await.expect("client"))
    }

    #[tokio::test]
    async fn probes_are_silent_and_plain_text_is_told_the_port_speaks_tls() {
        assert_eq!(outcome_of(None).await, ("silent", Vec::new()));
        // The preface and a request's HEADERS (empty, on stream 1).
        let request = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x01\x04\0\0\0\x01";
        let (outcome, answer) = outcome_of(Some(request)).await;
        assert_eq!((outcome, answer), ("plain HTTP/2", goaway_frames()));
        let (outcome, _) = outcome_of(Some(b"GET / HTTP/1.1\r\n\r\n")).await;
        assert_eq!(outcome, "plain text");
        // A TLS record holding an empty ClientHello: rustls refuses it.
        let (outcome, _) = outcome_of(Some(&[0x16, 3, 3, 0, 4, 1, 0, 0, 0])).await;
        assert_eq!(outcome, "refused");
    }

    /// A client whose certificate the coordinator refuses has, in TLS 1.3, finished its
    /// handshake and is sending its first request when the alert comes: it reads the alert
    /// (the cause) whatever it sent after the refusal, however long it keeps sending.
    #[tokio::test]
    async fn a_refused_client_certificate_reads_its_alert() {
        use tokio_rustls::rustls::ClientConfig;
        use tokio_rustls::rustls::pki_types::ServerName;
        let server = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
        let trusted_ca = rcgen::generate_simple_self_signed(vec!["ca".into()]).expect("ca");
        let stranger = rcgen::generate_simple_self_signed(vec!["worker".into()]).expect("cert");
        let tls = ServerTls {
            cert_pem: server.cert.pem().into_bytes(),
            key_pem: server.signing_key.serialize_pem().into_bytes(),
            client_ca_pem: Some(trusted_ca.cert.pem().into_bytes()),
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(server_config(&tls).expect("config"));
        let mut roots = RootCertStore::empty();
        roots.add(server.cert.der().clone()).expect("root");
        let key = PrivateKeyDer::from_pem_slice(stranger.signing_key.serialize_pem().as_bytes())
            .expect("key");
        let client_config = ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![stranger.cert.der().clone()], key)
            .expect("client config");
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (refused_tx, refused_rx) = tokio::sync::oneshot::channel();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            match handshake(tcp, &acceptor).await {
                Handshake::Alerted(reason, _, tcp) => {
                    let _ = refused_tx.send(reason);
                    linger(tcp).await;
                }
                _ => panic!("the stranger's certificate was not refused with an alert"),
            }
        });
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let name = ServerName::try_from("localhost").expect("name");
        // The client's half of a TLS 1.3 handshake ends before the server checks its
        // certificate.
        let mut stream = connector
            .connect(name, tcp)
            .await
            .expect("client handshake");
        stream
            .write_all(&[7u8; 16 << 10])
            .await
            .expect("first request");
        let reason = refused_rx.await.expect("the server's verdict");
        assert_eq!(reason, Refusal::UnknownIssuer);
        // After the refusal: more of the request, then the answer.
        let mut wrote = Ok(());
        for _ in 0..64 {
            wrote = stream.write_all(&[7u8; 16 << 10]).await;
            if wrote.is_err() {
                break;
            }
        }
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer).await;
        let told = match (&wrote, &read) {
            (Err(e), _) | (Ok(()), Err(e)) => e.to_string(),
            (Ok(()), Ok(_)) => String::from("no error"),
        };
        assert!(told.contains("received fatal alert"), "{told}");
        drop(stream);
        server.await.expect("server");
    }

    #[test]
    fn a_request_is_seen_after_the_preface_and_other_frames() {
        let mut bytes = HTTP2_PREFACE.to_vec();
        assert!(!holds_request(&bytes));
        // SETTINGS with one setting, then WINDOW_UPDATE: no request yet.
        bytes.extend_from_slice(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100]);
        bytes.extend_from_slice(&[0, 0, 4, 8, 0, 0, 0, 0, 0, 0, 1, 0, 0]);
        assert!(!holds_request(&bytes));
        // A HEADERS frame's header on stream 1 (its payload need not have come).
        bytes.extend_from_slice(&[0, 0, 40, 1, 4, 0, 0, 0, 1]);
        assert!(holds_request(&bytes));
        assert!(!holds_request(&bytes[..bytes.len() - 1]));
        // A payload's bytes that look like a HEADERS type are skipped.
        let mut tricky = HTTP2_PREFACE.to_vec();
        tricky.extend_from_slice(&[0, 0, 9, 4, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
        assert!(!holds_request(&tricky));
    }

    #[test]
    fn the_plain_text_answer_is_a_settings_and_a_goaway_frame() {
        let frames = goaway_frames();
        assert_eq!(&frames[..9], &[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let goaway = &frames[9..];
        let len = usize::from(goaway[1]) << 8 | usize::from(goaway[2]);
        assert_eq!((goaway[0], goaway[3]), (0, 7));
        assert_eq!(len, goaway.len() - 9);
        assert_eq!(&goaway[13..17], &[0, 0, 0, 0xc]);
        assert!(goaway.ends_with(PLAIN_TEXT_ANSWER));
    }
}
