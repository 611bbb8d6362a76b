//! The TLS causes named on real failures: tonic servers with and without TLS, and clients
//! that trust another CA, present no certificate or another CA's, or dial TLS to plain text.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use pipewise_proto::v1 as pb;
use pipewise_proto::v1::cluster_service_client::ClusterServiceClient;
use pipewise_worker::net::certs::{Issued, issue};
use pipewise_worker::net::{TlsCause, tls_cause};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Server, ServerTlsConfig};

/// A health-only server (every cluster call is `Unimplemented` once through TLS).
async fn serve(tls: Option<ServerTlsConfig>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = pipewise_proto::health_service();
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).unwrap();
    }
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(builder.add_service(health).serve_with_incoming(incoming));
    addr.to_string()
}

/// The cause of a call's failure (`None` when it reached the server).
async fn cause(url: String, tls: Option<ClientTlsConfig>) -> Option<TlsCause> {
    let mut endpoint = Endpoint::from_shared(url)
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).unwrap();
    }
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(e) => return Some(tls_cause(&e).unwrap_or_else(|| panic!("{e:?}"))),
    };
    let status = ClusterServiceClient::new(channel)
        .heartbeat(pb::HeartbeatRequest::default())
        .await
        .expect_err("no cluster service");
    if status.code() == tonic::Code::Unimplemented {
        return None;
    }
    Some(tls_cause(&status).unwrap_or_else(|| panic!("{status:?}")))
}

fn client(ca: &Issued, identity: Option<&Issued>) -> ClientTlsConfig {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.ca.cert))
        .domain_name("localhost");
    match identity {
        Some(i) => tls.identity(i.worker.identity()),
        None => tls,
    }
}

#[tokio::test]
async fn each_refused_connection_names_its_cause() {
    let hosts = ["localhost".to_string()];
    let (ours, theirs) = (issue(&hosts, 2).unwrap(), issue(&hosts, 2).unwrap());
    let server = |ca: &Issued| {
        ServerTlsConfig::new()
            .identity(ca.coordinator.identity())
            .client_ca_root(Certificate::from_pem(&ca.ca.cert))
    };
    let mutual = serve(Some(server(&ours))).await;
    let plain = serve(None).await;
    let https = |addr: &str| format!("https://{addr}");
    for (what, url, tls, expected) in [
        ("through", https(&mutual), client(&ours, Some(&ours)), None),
        (
            "another CA's server",
            https(&mutual),
            client(&theirs, Some(&ours)),
            Some(TlsCause::UnknownIssuer),
        ),
        (
            "no client certificate",
            https(&mutual),
            client(&ours, None),
            Some(TlsCause::CertificateRequired),
        ),
        (
            "another CA's client certificate",
            https(&mutual),
            client(&ours, Some(&theirs)),
            Some(TlsCause::CertificateRefused),
        ),
        (
            "TLS to plain text",
            https(&plain),
            client(&ours, None),
            Some(TlsCause::NotTls),
        ),
    ] {
        assert_eq!(cause(url, Some(tls)).await, expected, "{what}");
    }
    // Plain text to plain text reaches the server: nothing to explain.
    assert_eq!(cause(format!("http://{plain}"), None).await, None);
}
