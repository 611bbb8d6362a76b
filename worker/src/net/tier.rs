//! [`Tier`]: how frames travel between two workers.

/// How frames travel to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Through a ring in shared memory (a peer on the same host).
    Shm,
    /// Over gRPC, in plain text.
    Grpc,
    /// Over gRPC with mutual TLS.
    GrpcTls,
}

impl Tier {
    /// Its name in traces and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Shm => "shm",
            Tier::Grpc => "grpc",
            Tier::GrpcTls => "grpc-tls",
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
